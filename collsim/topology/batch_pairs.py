"""Routes and multipath paths of arrays of device pairs, in pair order: the batch router
(:class:`~collsim.topology.batch.BatchRoutes`) for the pairs it covers, the per-pair router
(:meth:`Network.route_index`, :meth:`Network.paths_index`) for the rest, merged as CSR arrays.

What :meth:`TopologyFabric.routes` and :meth:`TopologyFabric.paths` serve; the answer is the
per-pair router's to the bit (tests/topology/test_batch.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from collsim.topology.batch import BatchRoutes
    from collsim.topology.graph import Network


def _csr(rows: list[tuple[int, ...]]) -> tuple[np.ndarray, np.ndarray]:
    ptr = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum([len(r) for r in rows], out=ptr[1:])
    flat = np.fromiter((x for r in rows for x in r), dtype=np.int64, count=int(ptr[-1]))
    return ptr, flat


def _merge(
    n: int, parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]]
) -> tuple[np.ndarray, np.ndarray]:
    """One CSR ``(ptr, values)`` of ``n`` rows from parts ``(rows, ptr, values)`` that each
    hold some of the rows."""
    lengths = np.zeros(n, dtype=np.int64)
    for rows, ptr, _ in parts:
        lengths[rows] = np.diff(ptr)
    out = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    dtype = np.result_type(*(v.dtype for _, _, v in parts)) if parts else np.int64
    values = np.empty(int(out[-1]), dtype=dtype)
    for rows, ptr, vals in parts:
        lens = np.diff(ptr)
        pos = np.repeat(out[:-1][rows] - ptr[:-1], lens) + np.arange(int(ptr[-1]))
        values[pos] = vals
    return out, values


def concat(*mats: np.ndarray) -> np.ndarray:
    """Matrices padded with -1, side by side (valid entries keep their order)."""
    return np.concatenate(mats, axis=1)


def _gather(ptr: np.ndarray, idx: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The CSR ``(ptr, idx)`` of only ``rows``, in that order."""
    lengths = ptr[1:][rows] - ptr[:-1][rows]
    out = np.zeros(rows.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    offsets = np.arange(int(out[-1]), dtype=np.int64) - np.repeat(out[:-1], lengths)
    return out, idx[np.repeat(ptr[:-1][rows], lengths) + offsets]


def _split(batch: BatchRoutes, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Which pairs (device ids) the batch router takes: GPUs in two distinct servers."""
    if not batch.enabled:
        return np.zeros(src.shape[0], dtype=bool)
    server = batch.router.server  # type: ignore[union-attr]
    kinds = batch.is_gpu
    return (
        kinds[src]
        & kinds[dst]
        & (server[src] >= 0)
        & (server[dst] >= 0)
        & (server[src] != server[dst])
    )


def routes(net: Network, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, ...]:
    """CSR ``(ptr, links)`` and latency of the routes between devices ``src[i] -> dst[i]``:
    :meth:`Network.route_index`'s, found in batches where :class:`BatchRoutes` applies."""
    batch = net.batch
    fast = _split(batch, src, dst)
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    lat = np.zeros(src.shape[0])
    slow = np.flatnonzero(~fast)
    if fast.any():
        rows = np.flatnonzero(fast)
        found = batch.cables(src[rows], dst[rows])
        if found is None:
            slow = np.arange(src.shape[0])
        else:
            cab = concat(found["head"], found["middle"], found["tail"])
            ptr, links = batch.loaded(cab)
            parts.append((rows, ptr, links))
            lat[rows] = batch.latency(cab)
    copies = net.copies if slow.size else None
    if copies is not None:  # inside a server that copies another: that one's route, moved
        moved, ptr, links, lat_moved = copies.routes(src[slow], dst[slow])
        if moved.any():
            parts.append((slow[moved], ptr, links))
            lat[slow[moved]] = lat_moved
            slow = slow[~moved]
    if slow.size:
        found_r = [net.route_index(int(src[i]), int(dst[i])) for i in slow.tolist()]
        ptr, links = _csr([r.links for r in found_r])
        parts.append((slow, ptr, links))
        lat[slow] = [r.latency_s for r in found_r]
    ptr, links = _merge(src.shape[0], parts)
    return ptr, links, lat


def paths(net: Network, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, ...]:
    """:meth:`Network.paths_index` of each pair ``src[i] -> dst[i]`` (devices) as CSR:
    ``(pair_ptr, weight, ptr, links, latency)`` (see :meth:`TopologyFabric.paths`)."""
    batch = net.batch
    fast = _split(batch, src, dst) if net.multipath is not None else np.zeros(src.shape, bool)
    slow = np.flatnonzero(~fast)
    lat = np.zeros(src.shape[0])
    pair_parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    weights: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    path_rows: list[np.ndarray] = []  # per part, the (global) pair of each of its paths
    path_csr: list[tuple[np.ndarray, np.ndarray]] = []
    if fast.any():
        rows = np.flatnonzero(fast)
        found = batch.cables(src[rows], dst[rows])
        salt = (batch.key[src[rows]], batch.key[dst[rows]])
        sets = None
        if found is not None:
            one = found["exit"] == found["entry"]  # one switch: the route alone
            sets = batch.segsets(found, salt, one)
        if sets is None:
            slow = np.arange(src.shape[0])
        else:
            pair_ptr, seg_ids, shares = sets
            npaths = np.diff(pair_ptr)
            which = np.repeat(np.arange(rows.size), npaths)
            segs = batch.pieces.matrix[seg_ids]
            cab = concat(found["head"][which], segs, found["tail"][which])
            ptr, links = batch.loaded(cab)
            pair_parts.append((rows, pair_ptr, np.zeros(0)))
            weights.append((rows, pair_ptr, shares))
            path_rows.append(rows[which])
            path_csr.append((ptr, links))
            route = concat(found["head"], found["middle"], found["tail"])
            lat[rows] = batch.latency(route)
    if slow.size:
        found_p = [net.paths_index(int(src[i]), int(dst[i])) for i in slow.tolist()]
        npaths = np.array([len(f) for f in found_p], dtype=np.int64)
        pair_ptr = np.zeros(slow.size + 1, dtype=np.int64)
        np.cumsum(npaths, out=pair_ptr[1:])
        weights.append((slow, pair_ptr, np.array([w for f in found_p for _, w in f], dtype=float)))
        path_rows.append(np.repeat(slow, npaths))
        path_csr.append(_csr([p for f in found_p for p, _ in f]))
        lat[slow] = [net.route_index(int(src[i]), int(dst[i])).latency_s for i in slow.tolist()]
    pair_ptr, weight = _merge(src.shape[0], weights)
    # the paths in pair order: each part's paths are already in their pairs' order
    owner = np.concatenate(path_rows) if path_rows else np.zeros(0, dtype=np.int64)
    if len(path_csr) == 1 and np.all(owner[1:] >= owner[:-1]):  # already in pair order
        return pair_ptr, weight, path_csr[0][0], path_csr[0][1], lat
    order = np.argsort(owner, kind="stable")
    lengths = np.concatenate([np.diff(p) for p, _ in path_csr]) if path_csr else np.zeros(0, int)
    flat = np.concatenate([v for _, v in path_csr]) if path_csr else np.zeros(0, dtype=np.int64)
    ptr_all = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=ptr_all[1:])
    ptr, links = _gather(ptr_all, flat, order)
    return pair_ptr, weight, ptr, links, lat
