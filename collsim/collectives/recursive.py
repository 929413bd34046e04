"""Recursive halving / doubling: latency-optimal ``O(log n)``-step algorithms (MPICH's defaults).

* all_reduce ``rhd``: Rabenseifner's algorithm as in Thakur, Rabenseifner & Gropp, "Optimization of
  Collective Communication Operations in MPICH" (IJHPCA 2005): reduce-scatter by recursive halving,
  then all-gather by recursive doubling, ``2 log2 p`` steps moving ``2(p-1)/p`` of the buffer.
* reduce_scatter ``rd``: recursive halving; all_gather ``rd``: recursive doubling.

Non-powers of two use the paper's standard fold: with ``p`` the largest power of two not above
``n`` and ``r = n - p``, the first ``2r`` ranks pair up; each even one hands its data to its odd
partner (reducing there) and sits out; the ``p`` survivors run the power-of-two algorithm on
*virtual* blocks (survivor ``v`` owns its partner's block too); finally the survivors hand the
extras their results.

The helpers run ``R`` independent groups of equal size at once (the same-local-index groups of a
hierarchical all-reduce), one numpy batch per step.
"""

from __future__ import annotations

import numpy as np

from collsim.collectives.common import (
    BuildSpec,
    add_reductions,
    cat_deps,
    no_deps,
    self_copy,
    split_bounds,
)
from collsim.collectives.schedule import Schedule, ScheduleBuilder


class Fold:
    """The power-of-two core of ``n`` members: ``p``, ``r = n - p``, survivors and extras."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.p = 1 << (n.bit_length() - 1)
        self.r = n - self.p
        self.steps = self.p.bit_length() - 1
        v = np.arange(self.p)
        self.survivor = np.where(v < self.r, 2 * v + 1, v + self.r)  # member of virtual rank v
        self.extra = 2 * np.arange(self.r)  # extra 2i folds into member 2i + 1 (virtual i)


def _pairs(p: int, d: int, halving: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Virtual ranks, partners at distance ``d``, and the first virtual block each one sends.

    Halving sends the partner's aligned ``d`` blocks; doubling sends one's own.
    """
    v = np.arange(p)
    u = v ^ d
    lo = (u if halving else v) & ~(d - 1)
    return v, u, lo


def _send(
    b: ScheduleBuilder,
    groups: np.ndarray,
    src_m: np.ndarray,
    dst_m: np.ndarray,
    off: np.ndarray,
    cnt: np.ndarray,
    bufs: tuple[str, str],
    deps: np.ndarray | None,
    reduce: bool,
    channel: int,
    dst_off: np.ndarray | None = None,
) -> np.ndarray:
    """One batch of transfers member ``src_m`` -> ``dst_m`` in every group; ids shaped (R, k)."""
    nr = groups.shape[0]
    shape = (nr, src_m.shape[0])
    ids = b.transfers(
        groups[:, src_m].reshape(-1),
        groups[:, dst_m].reshape(-1),
        np.broadcast_to(cnt, shape).reshape(-1),
        bufs[0],
        np.broadcast_to(off, shape).reshape(-1),
        bufs[1],
        np.broadcast_to(off if dst_off is None else dst_off, shape).reshape(-1),
        reduce=reduce,
        deps=deps,
        channel=channel,
    )
    return ids.reshape(shape)


def halving(
    b: ScheduleBuilder,
    groups: np.ndarray,
    vb: np.ndarray,
    fold: Fold,
    *,
    buf: str,
    first: np.ndarray,
    rx: np.ndarray,
    nsteps: int,
    channel: int,
) -> list[np.ndarray]:
    """The first ``nsteps`` recursive-halving steps, accumulating in place in ``buf``.

    ``vb`` (R, p+1): virtual block boundaries. ``first`` (R, p, k): what each virtual rank's first
    send waits for; ``rx`` (R, p, k): what must precede any write into a virtual rank. Returns the
    send ids of each step, (R, p). A send depends on the previous step's receive and send.
    """
    nr, p = groups.shape[0], fold.p
    sends: list[np.ndarray] = []
    for k in range(nsteps):
        d = p >> (k + 1)
        v, u, lo = _pairs(p, d, halving=True)
        off, cnt = vb[:, lo], vb[:, lo + d] - vb[:, lo]
        data = first if k == 0 else _after(sends[-1], 2 * d)
        deps = cat_deps((nr, p), data, rx[:, u])
        sv, su = fold.survivor[v], fold.survivor[u]
        sends.append(_send(b, groups, sv, su, off, cnt, (buf, buf), deps, True, channel))
    return sends


def _after(sends: np.ndarray, d_prev: int) -> np.ndarray:
    """Deps of the next step: the last receive (from ``v ^ d_prev``) and the last send of ``v``."""
    v = np.arange(sends.shape[1])
    return np.stack([sends[:, v ^ d_prev], sends], axis=-1)


def doubling(
    b: ScheduleBuilder,
    groups: np.ndarray,
    vb: np.ndarray,
    fold: Fold,
    *,
    buf: str,
    first: np.ndarray,
    channel: int,
) -> np.ndarray:
    """Recursive-doubling all-gather of the virtual blocks in ``buf``; done ids (R, p, k)."""
    nr, p = groups.shape[0], fold.p
    last: np.ndarray | None = None
    for k in range(fold.steps):
        d = 1 << k
        v, u, lo = _pairs(p, d, halving=False)
        off, cnt = vb[:, lo], vb[:, lo + d] - vb[:, lo]
        deps = cat_deps((nr, p), first if last is None else _after(last, d >> 1))
        sv, su = fold.survivor[v], fold.survivor[u]
        last = _send(b, groups, sv, su, off, cnt, (buf, buf), deps, False, channel)
    return first if last is None else _after(last, p >> 1)


def rhd_all_reduce(
    b: ScheduleBuilder,
    groups: np.ndarray,
    bounds: np.ndarray,
    *,
    acc_buf: str,
    dst_buf: str,
    channel: int,
    ready: np.ndarray | None = None,
) -> np.ndarray:
    """All-reduce of region ``bounds[:, 0]:bounds[:, -1]`` within each group of ``groups`` (R, n).

    ``bounds`` (R, p+1) cuts the region into the ``p`` virtual blocks. In place when ``acc_buf ==
    dst_buf``; otherwise the input is accumulated in place and the result lands in ``dst_buf``.
    ``ready`` (R, n, k): what must finish before a member's region is touched. Returns per-member
    done ids (R, n, k).
    """
    nr, n = groups.shape
    fold = Fold(n)
    ready = no_deps(nr, n) if ready is None else ready.reshape(nr, n, -1)
    lo, total = bounds[:, :1], bounds[:, -1:] - bounds[:, :1]
    first = ready[:, fold.survivor]
    rx = ready[:, fold.survivor]
    if fold.r:
        e = fold.extra
        deps = cat_deps((nr, fold.r), ready[:, e], ready[:, e + 1])
        fin = _send(b, groups, e, e + 1, lo, total, (acc_buf, acc_buf), deps, True, channel)
        pad = np.full((nr, fold.p, 1), -1, dtype=np.int64)
        pad[:, : fold.r, 0] = fin
        first = np.concatenate([first, pad], axis=-1)
    in_place = acc_buf == dst_buf
    depth = fold.steps
    if depth == 0:  # a single member
        if in_place:
            done = first
        else:
            deps = cat_deps((nr, 1), first)
            done = self_copy(
                b, groups, total, acc_buf, lo, dst_buf, lo, deps, channel
            )[..., None]  # fmt: skip
    else:
        nsteps = depth if in_place else depth - 1
        sends = halving(
            b, groups, bounds, fold, buf=acc_buf, first=first, rx=rx, nsteps=nsteps,
            channel=channel,
        )  # fmt: skip
        if in_place:
            done = _after(sends[-1], 1)
        else:  # last step: plain into the owner's output, then add the owner's own partial
            v, u, blo = _pairs(fold.p, 1, halving=True)
            off, cnt = bounds[:, blo], bounds[:, blo + 1] - bounds[:, blo]
            data = first if depth == 1 else _after(sends[-1], 2)
            deps = cat_deps((nr, fold.p), data, rx[:, u])
            sv, su = fold.survivor[v], fold.survivor[u]
            last = _send(b, groups, sv, su, off, cnt, (acc_buf, dst_buf), deps, False, channel)
            own = np.diff(bounds, axis=1)
            done = add_reductions(
                b, groups[:, fold.survivor], own, acc_buf, bounds[:, :-1], dst_buf,
                bounds[:, :-1], _after(last, 1), channel,
            )[..., None]  # fmt: skip
    done = doubling(b, groups, bounds, fold, buf=dst_buf, first=done, channel=channel)
    out = np.full((nr, n, done.shape[-1]), -1, dtype=np.int64)
    out[:, fold.survivor] = done
    if fold.r:  # fold out: survivors hand the whole result to their extras
        e = fold.extra
        deps = cat_deps((nr, fold.r), done[:, : fold.r])
        ids = _send(b, groups, e + 1, e, lo, total, (dst_buf, dst_buf), deps, False, channel)
        out[:, e] = -1
        out[:, e, 0] = ids
    return out


# -- builders ---------------------------------------------------------------------------------


def build_all_reduce(spec: BuildSpec) -> Schedule:
    """Recursive halving-doubling all-reduce (Rabenseifner), any rank count via the fold."""
    b = ScheduleBuilder()
    n = spec.nranks
    groups = np.arange(n, dtype=np.int64)[None, :]
    p = Fold(n).p
    for c, lo, cnt in spec.channel_pieces(spec.count):
        bounds = (lo + split_bounds(cnt, p))[None, :]
        rhd_all_reduce(b, groups, bounds, acc_buf="input", dst_buf="output", channel=c)
    return spec.finish(b)


def _rank_bounds(spec: BuildSpec, lo: int, hi: int) -> np.ndarray:
    """Per-rank block boundaries ``r * blk`` clipped to the channel's share ``[lo, hi)``."""
    return np.clip(np.arange(spec.nranks + 1, dtype=np.int64) * spec.block, lo, hi)


def _local(pos: np.ndarray, rank: np.ndarray, blk: int) -> np.ndarray:
    """Offset of global position ``pos`` inside rank ``rank``'s block (clamped for empty pieces)."""
    return np.clip(pos - rank * blk, 0, blk)


def _virtual_bounds(ob: np.ndarray, fold: Fold) -> np.ndarray:
    """Virtual block boundaries: survivor ``v`` owns its extra's block and its own (contiguous)."""
    v = np.arange(fold.p)
    start = np.where(v < fold.r, 2 * v, v + fold.r)
    return np.concatenate([ob[start], ob[-1:]])[None, :]


def build_reduce_scatter(spec: BuildSpec) -> Schedule:
    """Recursive-halving reduce-scatter; channels take contiguous shares of the whole input."""
    b = ScheduleBuilder()
    n, blk = spec.nranks, spec.block
    fold = Fold(n)
    groups = np.arange(n, dtype=np.int64)[None, :]
    v = np.arange(fold.p)
    for c, lo, cnt in spec.channel_pieces(n * blk):
        ob = _rank_bounds(spec, lo, lo + cnt)
        if fold.steps == 0:
            self_copy(b, groups, cnt, "input", lo, "output", lo, no_deps(1, 1), c)
            continue
        first = no_deps(1, fold.p)
        if fold.r:  # fold in: extras add their whole share into their odd partners
            e = fold.extra
            fin = _send(b, groups, e, e + 1, lo, cnt, ("input", "input"), None, True, c)
            first = np.full((1, fold.p, 1), -1, dtype=np.int64)
            first[0, : fold.r, 0] = fin
        depth = fold.steps
        vb = _virtual_bounds(ob, fold)
        sends = halving(
            b, groups, vb, fold, buf="input", first=first, rx=no_deps(1, fold.p),
            nsteps=depth - 1, channel=c,
        )  # fmt: skip
        data = cat_deps((1, fold.p), first if depth == 1 else _after(sends[-1], 2))
        # Last step: v sends partner u its own block (plain, into the output) and, when u
        # stands in for an extra, the extra's block (reduced into u's input, forwarded below).
        u = v ^ 1
        sv, su = fold.survivor[v], fold.survivor[u]
        o_lo = ob[su]
        own = _send(
            b, groups, sv, su, o_lo, ob[su + 1] - o_lo, ("input", "output"), data, False, c,
            dst_off=_local(o_lo, su, blk),
        )[0]  # fmt: skip
        mine = np.stack([own[u], own], axis=-1)  # receive into w, and w's own last send
        s_w = fold.survivor
        add_reductions(
            b, s_w, ob[s_w + 1] - ob[s_w], "input", ob[s_w], "output", _local(ob[s_w], s_w, blk),
            mine, c,
        )  # fmt: skip
        if fold.r:
            w = u < fold.r
            x_lo = ob[2 * u[w]]
            ext = _send(
                b, groups, sv[w], su[w], x_lo, ob[2 * u[w] + 1] - x_lo, ("input", "input"),
                data.reshape(fold.p, -1)[w], True, c,
            )[0]  # fmt: skip
            into = np.full(fold.p, -1, dtype=np.int64)
            into[u[w]] = ext
            e = fold.extra
            deps = np.concatenate([into[: fold.r, None], mine[: fold.r]], axis=-1)
            _send(
                b, groups, e + 1, e, ob[e], ob[e + 1] - ob[e], ("input", "output"), deps, False,
                c, dst_off=_local(ob[e], e, blk),
            )  # fmt: skip
    return spec.finish(b)


def build_all_gather(spec: BuildSpec) -> Schedule:
    """Recursive-doubling all-gather; channels take contiguous shares of the whole output."""
    b = ScheduleBuilder()
    n, blk = spec.nranks, spec.block
    fold = Fold(n)
    groups = np.arange(n, dtype=np.int64)[None, :]
    for c, lo, cnt in spec.channel_pieces(n * blk):
        ob = _rank_bounds(spec, lo, lo + cnt)
        vb = _virtual_bounds(ob, fold)
        s_w = fold.survivor
        mine = self_copy(
            b, s_w, ob[s_w + 1] - ob[s_w], "input", _local(ob[s_w], s_w, blk), "output", ob[s_w],
            no_deps(fold.p), c,
        )  # fmt: skip
        first = mine[None, :, None]
        if fold.r:
            e = fold.extra
            x_lo = ob[e]
            fin = _send(
                b, groups, e, e + 1, _local(x_lo, e, blk), ob[e + 1] - x_lo, ("input", "output"),
                no_deps(fold.r), False, c, dst_off=x_lo,
            )  # fmt: skip
            pad = np.full((1, fold.p, 1), -1, dtype=np.int64)
            pad[:, : fold.r, 0] = fin
            first = np.concatenate([first, pad], axis=-1)
        done = doubling(b, groups, vb, fold, buf="output", first=first, channel=c)
        if fold.r:
            e = fold.extra
            deps = cat_deps((1, fold.r), done[:, : fold.r])
            _send(b, groups, e + 1, e, lo, cnt, ("output", "output"), deps, False, c)
    return spec.finish(b)
