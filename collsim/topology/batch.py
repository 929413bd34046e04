"""Routes and multipath paths of many GPU pairs at once, exactly as the per-pair router gives them.

An all-to-all on 2,160 GPUs needs 4.7 million routes; found one pair at a time
(:meth:`Network.route_index`, :meth:`Network.paths_index`) that took most of an hour. A route
between two servers of a :class:`~collsim.topology.routing.ServerFabricRouter` is three parts: a
walk inside the source's server to the port where it leaves, a walk across the fabric switches,
and a walk inside the destination's server. This module finds them for arrays of pairs with numpy,
reusing what repeats:

* the port pair (exit, entry) minimising the total distance, with the router's hashed choice
  among ties (:func:`mix_np`, the same splitmix64 as :func:`~collsim.topology.routing.mix`);
* the walk inside a server, once per (GPU, port) where it meets no tie (then it does not depend
  on the pair's hash); with a tie, the router's own walk for that pair;
* the walk across the fabric, all pairs in lockstep, the equal-cost next hops looked up once per
  (switch, goal) and the tie broken by each pair's hash;
* the multipath paths (:mod:`collsim.topology.multipath`), once per (entry switch, exit switch,
  endpoint class, minimal path), every path being the pair's two server walks around one segment.

* on InfiniBand, D-mod-k as the router takes it: where every equal-cost next hop forwards by
  destination, the pair's destination index picks among them in natural name order (its
  quotient by the choices made before, as the subnet manager's tables do).

Pairs it does not cover (inside one server; capacities shared by several links; a generic
router) take the per-pair router, so the answer is always the
router's own: the same links in the same order, the same latency to the bit (tests check both
on every catalog topology).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from collsim.topology.multipath import VARIANTS
from collsim.topology.nexthops import NextHops
from collsim.topology.routing import ServerFabricRouter

if TYPE_CHECKING:
    from collsim.topology.graph import Network

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def mix_np(*values: np.ndarray | int) -> np.ndarray:
    """:func:`~collsim.topology.routing.mix` of arrays (uint64, wrapping as the masked ints do)."""
    arrays = [
        np.asarray(v, dtype=np.uint64) if isinstance(v, np.ndarray)
        else np.uint64(int(v) % (1 << 64))
        for v in values
    ]  # fmt: skip
    shape = np.broadcast_shapes(*(np.shape(a) for a in arrays))
    h = np.full(shape, _GOLDEN, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for v in arrays:
            h = h ^ (v + _GOLDEN + (h << np.uint64(6)) + (h >> np.uint64(2)))
            h = (h ^ (h >> np.uint64(30))) * _M1
            h = (h ^ (h >> np.uint64(27))) * _M2
            h = h ^ (h >> np.uint64(31))
    return h


def _mod(h: np.ndarray, count: np.ndarray) -> np.ndarray:
    """``h % count`` of a uint64 hash and positive counts, as int64."""
    return (h % np.asarray(count, dtype=np.uint64)).astype(np.int64)


def walk_once(
    start: int, goal: int, dist: list[float], csr: tuple[list, list, list, list]
) -> list[int] | None:
    """:func:`~collsim.topology.routing._walk_lists` where no step has a tie (then the walk does
    not depend on the hash); ``None`` where some step has one or no next hop."""
    indptr, indices, data, link_of = csr
    hops: list[int] = []
    cur = start
    while cur != goal:
        here = dist[cur]
        ok = [k for k in range(indptr[cur], indptr[cur + 1]) if dist[indices[k]] + data[k] == here]
        if len(ok) != 1:
            return None
        hops.append(link_of[ok[0]])
        cur = indices[ok[0]]
    return hops


def _matrix(rows: list[tuple[int, ...]]) -> np.ndarray:
    """Tuples of link ids as a matrix padded with -1."""
    width = max((len(r) for r in rows), default=0)
    out = np.full((len(rows), width), -1, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


class _Pieces:
    """Distinct link tuples with ids, and their matrix (padded with -1), grown on demand."""

    def __init__(self) -> None:
        self.ids: dict[tuple[int, ...], int] = {}
        self.rows: list[tuple[int, ...]] = []
        self._mat: np.ndarray | None = None

    def add(self, links: tuple[int, ...]) -> int:
        i = self.ids.get(links)
        if i is None:
            i = self.ids[links] = len(self.rows)
            self.rows.append(links)
            self._mat = None
        return i

    @property
    def matrix(self) -> np.ndarray:
        if self._mat is None:
            self._mat = _matrix(self.rows or [()])
        return self._mat


class BatchRoutes:
    """Routes and paths of arrays of device pairs on one :class:`Network` (see the module doc)."""

    def __init__(self, network: Network) -> None:
        self.net = network
        router = network._fast
        self.router = router
        self.enabled = isinstance(router, ServerFabricRouter) and not network._shared
        graph = network.graph
        self.key = np.array(graph.key[: graph.n_devices], dtype=np.uint64)
        self.kind_switch = np.array([d.kind == "switch" for d in network.devices])
        self.is_gpu = np.array([d.kind == "gpu" for d in network.devices])
        self.pieces = _Pieces()  # server walks, fabric walks, segments
        self._head: dict[tuple[int, int], int] = {}  # (src, exit) -> piece, -1: has ties
        self._tail: dict[tuple[int, int], int] = {}  # (entry, dst) -> piece, -1: has ties
        self._ports: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._all_ports: dict[bool, tuple[np.ndarray, np.ndarray]] = {}
        self._last: tuple[bytes, dict[str, np.ndarray] | None] | None = None
        empty = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
        self._walk_table = {True: empty, False: empty}  # sorted (GPU, port) codes -> piece
        self._hops: NextHops | None = None  # equal-cost fabric next hops (first use)
        self._segsets: dict[tuple[int, int, int, int], tuple[np.ndarray, np.ndarray]] = {}
        self._coupled: bool | None = None  # some cable short of full duplex (first use)
        self._dest_of_link: np.ndarray | None = None  # D-mod-k index per link (first use)

    # -- the parts ---------------------------------------------------------------------------------
    def _port_dists(self, dev: int, out: bool) -> tuple[np.ndarray, np.ndarray]:
        """A GPU's server ports (device ids) and its distance to (``out``) or from each."""
        key = dev if out else -1 - dev
        found = self._ports.get(key)
        if found is None:
            r = self.router
            region, dist = r._from_source(dev) if out else r._to_dest(dev)
            ports = region.ports
            found = (ports, dist[region.local(ports)] if ports.size else np.zeros(0))
            self._ports[key] = found
        return found

    def _server_walk(self, src: int, port: int, out: bool) -> int:
        """Piece id of the tie-free walk from GPU ``src`` to ``port`` (``out``) or from ``port`` to
        GPU ``src``; -1 where the walk meets a tie (it then depends on the pair)."""
        cache = self._head if out else self._tail
        found = cache.get((src, port))
        if found is None:
            r = self.router
            if out:
                region, dist = r._from_source(src)
                start = int(region.local(self.net.graph.out_vertex[src]))
                hops = walk_once(int(region.local(port)), start, dist.tolist(), region._rev_lists)
                if hops is not None:
                    hops.reverse()
            else:
                region, dist = r._to_dest(src)
                start = int(region.local(self.net.graph.out_vertex[port]))
                hops = walk_once(start, int(region.local(src)), dist.tolist(), region._fwd_lists)
            found = -1 if hops is None else self.pieces.add(tuple(hops))
            cache[(src, port)] = found
        return found

    def _next_hops(self) -> NextHops:
        if self._hops is None:
            r = self.router
            rank = r._dmodk[0] if r._dmodk is not None else None
            self._hops = NextHops(r._fab_fwd, r._fabric_dist(), r._fab_link, rank,
                                  self.net.graph.by_destination)  # fmt: skip
        return self._hops

    def _fabric_walks(
        self,
        start: np.ndarray,
        goal: np.ndarray,
        salt: tuple[np.ndarray, np.ndarray],
        dest: np.ndarray,
    ) -> np.ndarray:
        """The router's fabric walk (:func:`~collsim.topology.routing._walk`, ordered) of every
        pair at once: links as a matrix padded with -1. ``dest``: each pair's D-mod-k
        destination index (-1: none, hashed ties)."""
        r = self.router
        f = r._fab_fwd
        fab_key = np.array(r._fab_key, dtype=np.uint64)
        cur = start.copy()
        stride = np.ones(cur.shape[0], dtype=np.int64)
        cols: list[np.ndarray] = []
        while True:
            idx = np.flatnonzero(cur != goal)
            if idx.size == 0:
                break
            hops = self._next_hops()
            row = hops.rows(cur[idx], goal[idx])
            cnt = hops.count[row]
            if np.any(cnt == 0):
                raise RuntimeError("fabric walk without a next hop")  # the router's check failed
            by_dest = hops.by_dest[row] & (dest[idx] >= 0)
            pick = np.zeros(idx.size, dtype=np.int64)
            tie = cnt > 1
            hashed = tie & ~by_dest
            if hashed.any():
                ti = idx[hashed]
                pick[hashed] = _mod(mix_np(salt[0][ti], salt[1][ti], fab_key[cur[ti]]),
                                    cnt[hashed])  # fmt: skip
            entry = hops.entries[hops.start[row] + pick]
            ranked_tie = tie & by_dest
            if ranked_tie.any():  # D-mod-k: the destination's index picks, in name order
                ti = idx[ranked_tie]
                at = (dest[ti] // stride[ti]) % cnt[ranked_tie]
                entry[ranked_tie] = hops.ranked[hops.start[row[ranked_tie]] + at]
                stride[ti] *= cnt[ranked_tie]
            col = np.full(cur.shape[0], -1, dtype=np.int64)
            col[idx] = r._fab_link[entry]
            cols.append(col)
            cur[idx] = f.indices[entry]
        if not cols:
            return np.zeros((cur.shape[0], 0), dtype=np.int64)
        return np.stack(cols, axis=1)

    # -- routes ------------------------------------------------------------------------------------
    def _gpu_ports(self, out: bool) -> tuple[np.ndarray, np.ndarray]:
        """Per device (rows; filled for GPUs): its server's ports (device ids, padded with -1)
        and the GPU's distance to (``out``) or from each (``inf`` padding)."""
        found = self._all_ports.get(out)
        if found is None:
            gpus = [i for i, d in enumerate(self.net.devices) if d.kind == "gpu"]
            each = [self._port_dists(g, out) for g in gpus]
            width = max((p.size for p, _ in each), default=0)
            ports = np.full((len(self.net.devices), width), -1, dtype=np.int64)
            dist = np.full((len(self.net.devices), width), np.inf)
            for g, (p, d) in zip(gpus, each, strict=True):
                ports[g, : p.size], dist[g, : p.size] = p, d
            found = (ports, dist)
            self._all_ports[out] = found
        return found

    def _server_walks(self, dev: np.ndarray, port: np.ndarray, out: bool) -> np.ndarray:
        """:meth:`_server_walk` of arrays (each distinct (GPU, port) looked up once)."""
        n = len(self.net.devices)
        codes = dev * n + port
        known, ids = self._walk_table[out]
        at = np.minimum(np.searchsorted(known, codes), max(known.size - 1, 0))
        hit = known[at] == codes if known.size else np.zeros(codes.shape, dtype=bool)
        if not hit.all():
            new = np.unique(codes[~hit])
            found = np.array([self._server_walk(int(c // n), int(c % n), out)
                              for c in new.tolist()], dtype=np.int64)  # fmt: skip
            known, ids = np.concatenate((known, new)), np.concatenate((ids, found))
            order = np.argsort(known, kind="stable")
            known, ids = known[order], ids[order]
            self._walk_table[out] = (known, ids)
            at = np.searchsorted(known, codes)
        return ids[at]

    def cables(self, src: np.ndarray, dst: np.ndarray) -> dict[str, np.ndarray] | None:
        """For pairs of GPUs (device ids) in distinct servers: each pair's head, fabric and tail
        walks as matrices padded with -1, and its exit and entry ports; ``None`` where the fast
        path does not apply (then every pair takes the per-pair router)."""
        key = src.tobytes() + dst.tobytes()
        if self._last is not None and self._last[0] == key:  # a wave asks routes, then paths
            return self._last[1]
        found = self._cables(src, dst)
        self._last = (key, found)
        return found

    def _cables(self, src: np.ndarray, dst: np.ndarray) -> dict[str, np.ndarray] | None:
        r = self.router
        graph = self.net.graph
        exits, a = self._gpu_ports(True)
        entries, b = self._gpu_ports(False)
        width = exits.shape[1]
        if width == 0 or entries.shape[1] != width:
            return None
        fab = r._fabric_dist()
        fl = r._fabric_local
        ex, en = exits[src], entries[dst]
        between = fab[fl[np.maximum(ex, 0)][:, :, None], fl[np.maximum(en, 0)][:, None, :]]
        between = np.where((ex[:, :, None] >= 0) & (en[:, None, :] >= 0), between, np.inf)
        total = a[src][:, :, None] + between
        total = total + b[dst][:, None, :]
        flat = total.reshape(total.shape[0], -1)
        best = flat.min(axis=1)
        if not np.all(np.isfinite(best)):
            return None
        hit = flat == best[:, None]
        ks, kd = self.key[src], self.key[dst]
        k = _mod(mix_np(ks, kd, -1), hit.sum(axis=1))
        pos = np.argmax(hit & (np.cumsum(hit, axis=1) == (k + 1)[:, None]), axis=1)
        rows = np.arange(pos.size)
        exit_dev = ex[rows, pos // width]
        entry_dev = en[rows, pos % width]
        head = self._server_walks(src, exit_dev, True)
        tail = self._server_walks(dst, entry_dev, False)
        mat = self.pieces.matrix
        heads, tails = mat[np.maximum(head, 0)], mat[np.maximum(tail, 0)]
        for i in np.flatnonzero(head < 0).tolist():  # a tie inside the server: the pair's walk
            s, e = int(src[i]), int(exit_dev[i])
            region, dist = r._from_source(s)
            walk = region.path_back(s, e, dist, (graph.key[s], graph.key[int(dst[i])]))
            heads = _put(heads, i, walk)
        for i in np.flatnonzero(tail < 0).tolist():
            d, e = int(dst[i]), int(entry_dev[i])
            region, dist = r._to_dest(d)
            walk = region.path_forward(e, d, dist, (graph.key[int(src[i])], graph.key[d]))
            tails = _put(tails, i, walk)
        dest = np.full(src.shape[0], -1, dtype=np.int64)
        if r._dmodk is not None and tails.shape[1]:  # entering through an InfiniBand edge port
            index = self._dest_index()
            first = tails[:, 0]
            dest = np.where(first >= 0, index[np.maximum(first, 0)], -1)
        middle = self._fabric_walks(fl[exit_dev], fl[entry_dev], (ks, kd), dest)
        return {"head": heads, "middle": middle, "tail": tails, "exit": exit_dev,
                "entry": entry_dev}  # fmt: skip

    def _dest_index(self) -> np.ndarray:
        """Per directed link, the D-mod-k index of the destination it leads down to (-1: none)."""
        if self._dest_of_link is None:
            found = np.full(self.net.n_directed_links, -1, dtype=np.int64)
            assert self.router._dmodk is not None
            for link, i in self.router._dmodk[1].items():
                found[link] = i
            self._dest_of_link = found
        return self._dest_of_link

    def loaded(self, cables: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """CSR ``(ptr, links)`` of rows of cables (padded with -1): each row's cables and then
        the coupling links of those short of full duplex, as :meth:`Network._route_of`."""
        coupling = self.net._coupling
        if self._coupled is None:
            self._coupled = bool(np.any(coupling >= 0))
        if self._coupled:
            coupled = np.where(cables >= 0, coupling[np.maximum(cables, 0)], -1)
            full = np.concatenate((cables, coupled), axis=1)
        else:  # no cable short of full duplex: the cables alone (the same rows, half the work)
            full = cables
        keep = full >= 0
        ptr = np.zeros(full.shape[0] + 1, dtype=np.int64)
        np.cumsum(keep.sum(axis=1), out=ptr[1:])
        return ptr, full[keep]

    def latency(self, cables: np.ndarray) -> np.ndarray:
        """Each row's route latency, summed as :meth:`Network._route_of` sums it (its links',
        then the devices' between them), so the bits agree."""
        net = self.net
        n = (cables >= 0).sum(axis=1)
        out = np.zeros(cables.shape[0])
        for length in np.unique(n).tolist():
            rows = np.flatnonzero(n == length)
            hops = _compact(cables[rows], length)
            links = net.latency_s[hops].sum(axis=1)
            devices = net.device_latency_s[net.link_dst[hops[:, :-1]]].sum(axis=1)
            out[rows] = links + devices
        return out

    def segsets(
        self, parts: dict[str, np.ndarray], salt: tuple[np.ndarray, np.ndarray], one: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Per pair, its multipath segments between the exit and entry switches: (pair_ptr,
        segment piece ids, shares); pairs ``one`` (exit and entry one switch) keep their route
        alone. ``None`` where some pair's route does not cross the switches as one run from its
        exit to its entry (the per-pair code then decides)."""
        net = self.net
        mp = net.multipath
        assert mp is not None
        middle = parts["middle"]
        exit_dev, entry_dev = parts["exit"], parts["entry"]
        # the route's switches must be exactly the middle walk's devices, exit to entry
        devices = np.where(middle >= 0, net.link_dst[np.maximum(middle, 0)], -1)
        middle_switch = np.all((devices < 0) | self.kind_switch[np.maximum(devices, 0)], axis=1)
        for name in ("head", "tail"):
            m = parts[name]
            inner = np.where(m >= 0, net.link_dst[np.maximum(m, 0)], -1)
            if name == "head":  # its devices after the GPU, the exit last
                inner = np.where(inner == exit_dev[:, None], -1, inner)
            else:
                src_of = np.where(m >= 0, net.link_src[np.maximum(m, 0)], -1)
                inner = np.where(src_of == entry_dev[:, None], -1, src_of)
            if np.any((inner >= 0) & self.kind_switch[np.maximum(inner, 0)]):
                return None
        if not (middle_switch.all() and self.kind_switch[exit_dev].all()
                and self.kind_switch[entry_dev].all()):  # fmt: skip
            return None
        variant = np.where(one, -1, _mod(mix_np(*salt), np.full(salt[0].shape, VARIANTS)))
        # the distinct minimal paths, then the distinct (exit, entry, class, path)
        width = middle.shape[1]
        shift = np.int64(self.net.n_directed_links + 1)
        mcode = np.zeros(middle.shape[0], dtype=np.int64)
        if width and int(shift) ** width < (1 << 62):
            for c in range(width):
                mcode = mcode * shift + (middle[:, c] + 1)
            muniq, minv = np.unique(mcode, return_inverse=True)
            first = np.zeros(muniq.size, dtype=np.int64)
            first[minv.reshape(-1)[::-1]] = np.arange(middle.shape[0])[::-1]
        else:
            muniq, first, minv = np.unique(middle, axis=0, return_index=True, return_inverse=True)
        ids = np.array([self.pieces.add(tuple(int(x) for x in middle[i] if x >= 0))
                        for i in first.tolist()], dtype=np.int64)  # fmt: skip
        primary = ids[minv.reshape(-1)]
        n_dev = np.int64(len(net.devices))
        code = ((exit_dev * n_dev + entry_dev) * (VARIANTS + 1) + variant + 1) * np.int64(
            len(self.pieces.rows)
        ) + primary
        _, index, inv = np.unique(code, return_index=True, return_inverse=True)
        inv = inv.reshape(-1)
        sets = [self._segset(int(exit_dev[i]), int(entry_dev[i]), int(variant[i]),
                             int(primary[i])) for i in index.tolist()]  # fmt: skip
        counts = np.array([s[0].size for s in sets], dtype=np.int64)
        starts = np.zeros(len(sets) + 1, dtype=np.int64)
        np.cumsum(counts, out=starts[1:])
        seg_ids = np.concatenate([s[0] for s in sets])
        shares = np.concatenate([s[1] for s in sets])
        npaths = counts[inv]
        pair_ptr = np.zeros(inv.size + 1, dtype=np.int64)
        np.cumsum(npaths, out=pair_ptr[1:])
        offsets = np.arange(int(pair_ptr[-1])) - np.repeat(pair_ptr[:-1], npaths)
        rows = np.repeat(starts[:-1][inv], npaths) + offsets
        return pair_ptr, seg_ids[rows], shares[rows]

    def _segset(self, s: int, d: int, variant: int, primary: int) -> tuple[np.ndarray, np.ndarray]:
        key = (s, d, variant, primary)
        found = self._segsets.get(key)
        if found is None and variant < 0:
            found = (np.array([primary]), np.ones(1))
            self._segsets[key] = found
        if found is None:
            segs = self.net.multipath.segments_of(s, d, self.pieces.rows[primary], variant)  # type: ignore[union-attr]
            found = (np.array([self.pieces.add(tuple(p)) for p, _ in segs], dtype=np.int64),
                     np.array([w for _, w in segs], dtype=np.float64))  # fmt: skip
            self._segsets[key] = found
        return found


def _put(mat: np.ndarray, row: int, links: list[int]) -> np.ndarray:
    """``mat`` with row ``row`` set to ``links`` (padded; widened if needed)."""
    if len(links) > mat.shape[1]:
        mat = np.concatenate((mat, np.full((mat.shape[0], len(links) - mat.shape[1]), -1)), axis=1)
    mat[row] = -1
    mat[row, : len(links)] = links
    return mat


def _compact(rows: np.ndarray, length: int) -> np.ndarray:
    """Rows padded with -1 anywhere -> their ``length`` valid entries, in order."""
    return rows[rows >= 0].reshape(rows.shape[0], length)
