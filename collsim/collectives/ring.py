"""Ring algorithms (NCCL's default for bandwidth-bound sizes) and the vectorised ring-step helpers.

Ring reduce-scatter (Patarasuk & Yuan 2009; NCCL ``runRing``): on a ring of ``m`` positions the data
is cut into ``m`` blocks; at step ``s`` position ``i`` sends block ``(i - s - 1) mod m`` to position
``i + 1``, which reduces it (NCCL's fused recv-reduce: a ``reduce=True`` transfer). After ``m - 1``
steps position ``j`` holds block ``j`` fully reduced. Ring all-gather circulates each block
onward in ``m - 1`` plain steps. All-reduce is the two back to back: ``2(m - 1)`` steps, each
moving one block per rank, so each rank sends ``2(m - 1)/m`` of the buffer -- the bandwidth optimum.

Each step's transfer depends on the transfer that delivered its data in the previous step and
follows the same rank's previous send (``after``: a channel's sends to its neighbour go in order
over one connection, as in NCCL, but a send's latency overlaps the previous send's bytes), so an
engine replays the ring as fast as data arrives, without a global step barrier; a slow link
delays its own sender's later sends instead of being shared by them, and a slow hop's latency is
paid once per block that crosses it, not once per step.

Data flow and buffers. Partial sums accumulate in place in the *accumulation* buffer (the input for
a first phase: NCCL's recvReduceSend never writes the output either). The last hop into a block's
owner is a plain transfer into the owner's destination followed by a local ``REDUCTION`` adding the
owner's own contribution (NCCL fuses the two as recvReduceCopy); when accumulation and destination
coincide (a later phase of a hierarchical algorithm) the last hop is a ``reduce=True`` transfer.

The helpers work on ``R`` independent rings of equal size at once (all nodes' intra-node rings, all
columns of a 2D grid) and on blocks made of ``P`` pieces (non-contiguous blocks in hierarchical
all-gather/reduce-scatter), so a whole phase is one numpy batch.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from collsim.collectives.common import (
    BuildSpec,
    add_reductions,
    cat_deps,
    no_deps,
    self_copy,
    split_even,
)
from collsim.collectives.layout import RankLayout
from collsim.collectives.schedule import Schedule, ScheduleBuilder


@dataclass(frozen=True)
class RingBlocks:
    """``R`` rings of ``m`` positions and the block each position owns, as ``P`` pieces.

    ``src_off[r, j, p]``: where piece ``p`` of block ``j`` is read from (reduce-scatter: its place
    in every position's accumulation buffer; all-gather: its place in owner ``j``'s own buffer).
    ``dst_off[r, j, p]``: where it ends up (reduce-scatter: at owner ``j``; all-gather: everywhere).
    """

    ranks: np.ndarray  # (R, m)
    count: np.ndarray  # (R, m, P)
    src_off: np.ndarray  # (R, m, P)
    dst_off: np.ndarray  # (R, m, P)

    @classmethod
    def of(
        cls, ranks: np.ndarray, count: np.ndarray, src_off: np.ndarray, dst_off: np.ndarray
    ) -> RingBlocks:
        """Blocks from arrays broadcastable to ``(R, m, P)`` (``(R, m)`` means one piece)."""
        ranks = np.atleast_2d(np.asarray(ranks, dtype=np.int64))
        arrs = [np.asarray(x, dtype=np.int64) for x in (count, src_off, dst_off)]
        arrs = [x if x.ndim == 3 else np.broadcast_to(x, ranks.shape)[..., None] for x in arrs]
        shape = np.broadcast_shapes(*(x.shape for x in arrs), (*ranks.shape, 1))
        cnt, so, do = (np.ascontiguousarray(np.broadcast_to(x, shape)) for x in arrs)
        return cls(ranks, cnt, so, do)

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.count.shape  # type: ignore[return-value]


def _ready(ready: np.ndarray | None, r: int, m: int) -> np.ndarray:
    if ready is None:
        return no_deps(r, m)
    return np.asarray(ready, dtype=np.int64).reshape(r, m, -1)


_BATCH_OPS = 1 << 20
"""Most transfers emitted per batch: a batch's temporaries (a dozen int64 arrays per transfer)
stay ~100 MB however large the ring (a 4096-rank ring phase has 16.8 million transfers)."""


def _emit_steps(
    b: ScheduleBuilder,
    blk: RingBlocks,
    steps: range,
    shift: int,
    ids: np.ndarray,
    bufs: tuple[str, np.ndarray, str, np.ndarray],
    ready: np.ndarray,
    rx: np.ndarray,
    reduce: bool,
    channel: int,
    after0: np.ndarray | None = None,
) -> None:
    """Emit ring steps ``steps``; fill their ids into ``ids[s]`` (shape (S,R,m,P)).

    At step ``s`` position ``i`` sends block ``(i - s - shift) mod m`` to position ``i + 1``; it
    depends on the transfer that brought that block to ``i`` at step ``s - 1`` (``ready[i]`` at
    step 0) and on ``rx[i + 1]`` (the receiver's buffer being ready), and follows its own send of
    step ``s - 1`` on the connection (``after``; at step 0, ``after0[i]``: the send before this
    ring's first on that connection, if any). Steps go in batches of at most ``_BATCH_OPS``
    transfers (at least one step), in order, so op ids are those of a single batch.
    """
    per_step = max(1, int(np.prod(blk.shape)))
    span = max(1, _BATCH_OPS // per_step)
    for lo in range(steps.start, steps.stop, span):
        sub = range(lo, min(lo + span, steps.stop))
        _emit_batch(b, blk, sub, shift, ids, bufs, ready, rx, reduce, channel, after0)


def _emit_batch(
    b: ScheduleBuilder,
    blk: RingBlocks,
    steps: range,
    shift: int,
    ids: np.ndarray,
    bufs: tuple[str, np.ndarray, str, np.ndarray],
    ready: np.ndarray,
    rx: np.ndarray,
    reduce: bool,
    channel: int,
    after0: np.ndarray | None = None,
) -> None:
    """One batch of :func:`_emit_steps` (the steps of ``steps``, all earlier ones emitted)."""
    src_buf, src_tab, dst_buf, dst_tab = bufs
    nr, m, npc = blk.shape
    s = np.arange(steps.start, steps.stop)[:, None, None]
    i = np.arange(m)[None, None, :]
    rho = np.arange(nr)[None, :, None]
    j = (i - s - shift) % m
    shape = (len(steps), nr, m, npc)
    base = len(b)
    new = base + np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    ids[steps.start : steps.stop] = new
    width = max(1, ready.shape[2])
    data = np.full((*shape, width), -1, dtype=np.int64)
    first = steps.start
    if first == 0:
        data[0, ..., : ready.shape[2]] = ready[:, :, None, :]
        first = 1
    if first < steps.stop:
        prev = np.roll(ids[first - 1 : steps.stop - 1], 1, axis=2)  # ids[s-1][.., i-1, ..]
        data[first - steps.start :, ..., 0] = prev
    # In order per connection: position i's send at step s follows its own send at step s-1 (NCCL's
    # channel sends to its ring neighbour over one connection with fixed slots): its bytes go on
    # the wire once the previous send's are off it; its latency overlaps (``after``, not a dep).
    own = np.full(shape, -1, dtype=np.int64)
    if steps.start > 0 or len(steps) > 1:
        lo = 1 if steps.start == 0 else 0
        own[lo:] = ids[steps.start + lo - 1 : steps.stop - 1]
    if steps.start == 0 and after0 is not None:
        own[0] = after0
    recv = np.roll(rx, -1, axis=1)[None, :, :, None, :]  # rx of position i + 1
    deps = cat_deps(shape, data, recv)
    src = np.broadcast_to(blk.ranks[None, :, :, None], shape)
    dst = np.broadcast_to(np.roll(blk.ranks, -1, axis=1)[None, :, :, None], shape)
    got = b.transfers(
        src.reshape(-1),
        dst.reshape(-1),
        blk.count[rho, j].reshape(-1),
        src_buf,
        src_tab[rho, j].reshape(-1),
        dst_buf,
        dst_tab[rho, j].reshape(-1),
        reduce=reduce,
        deps=deps,
        channel=channel,
        after=own.reshape(-1),
    )
    if got.size and got[0] != base:  # pragma: no cover - builder contract
        raise RuntimeError("ring step ids out of sync with the builder")


def ring_reduce_scatter(
    b: ScheduleBuilder,
    blk: RingBlocks,
    *,
    acc_buf: str,
    dst_buf: str,
    channel: int,
    ready: np.ndarray | None = None,
) -> np.ndarray:
    """Ring reduce-scatter of ``blk`` (accumulating in ``acc_buf``, result in ``dst_buf``).

    ``ready[r, i]`` (ids, padded -1) must finish before position ``i``'s buffers are read or
    written. Returns per position the ids after which its block is fully reduced, ``(R, m, k)``.
    """
    nr, m, npc = blk.shape
    ready = _ready(ready, nr, m)
    in_place = acc_buf == dst_buf and np.array_equal(blk.src_off, blk.dst_off)
    if m == 1:
        if in_place:
            return ready
        deps = np.broadcast_to(ready[:, :, None, :], (nr, m, npc, ready.shape[2]))
        return self_copy(
            b, np.broadcast_to(blk.ranks[..., None], blk.shape), blk.count, acc_buf,
            blk.src_off, dst_buf, blk.dst_off, deps, channel,
        )  # fmt: skip
    ns = m - 1
    ids = np.empty((ns, nr, m, npc), dtype=np.int64)
    n_acc = ns if in_place else ns - 1
    acc = (acc_buf, blk.src_off, acc_buf, blk.src_off)
    if n_acc:
        _emit_steps(b, blk, range(n_acc), 1, ids, acc, ready, ready, True, channel)
    if in_place:
        return np.roll(ids[ns - 1], 1, axis=1)  # the last hop into each owner
    fin = (acc_buf, blk.src_off, dst_buf, blk.dst_off)
    _emit_steps(b, blk, range(ns - 1, ns), 1, ids, fin, ready, ready, False, channel)
    last_in = np.roll(ids[ns - 1], 1, axis=1)  # (R, m, P): final transfer into owner j
    deps = np.concatenate(
        [last_in[..., None], np.broadcast_to(ready[:, :, None, :], (nr, m, npc, ready.shape[2]))],
        axis=-1,
    )
    return add_reductions(
        b, np.broadcast_to(blk.ranks[..., None], blk.shape), blk.count, acc_buf, blk.src_off,
        dst_buf, blk.dst_off, deps, channel,
    )  # fmt: skip


def ring_all_gather(
    b: ScheduleBuilder,
    blk: RingBlocks,
    *,
    own_buf: str,
    dst_buf: str,
    channel: int,
    ready: np.ndarray | None = None,
    after: np.ndarray | None = None,
) -> np.ndarray:
    """Ring all-gather: owner ``j``'s block (``own_buf`` at ``src_off``) reaches every ``dst_buf``.

    When the owner's copy is elsewhere (all_gather's input), the owner also copies it locally, as
    NCCL's copySend does. ``after[i]``: the send its first send follows on the connection (its
    latency overlaps that send's bytes). Returns per position every op that wrote into it,
    ``(R, m, k)``.
    """
    nr, m, npc = blk.shape
    ready = _ready(ready, nr, m)
    copy = not (own_buf == dst_buf and np.array_equal(blk.src_off, blk.dst_off))
    done = []
    if copy:
        deps = np.broadcast_to(ready[:, :, None, :], (nr, m, npc, ready.shape[2]))
        done.append(
            self_copy(
                b,
                np.broadcast_to(blk.ranks[..., None], blk.shape),
                blk.count,
                own_buf,
                blk.src_off,
                dst_buf,
                blk.dst_off,
                deps,
                channel,
            )
        )
    if m > 1:
        ns = m - 1
        ids = np.empty((ns, nr, m, npc), dtype=np.int64)
        relay = (dst_buf, blk.dst_off, dst_buf, blk.dst_off)
        rx = no_deps(nr, m)
        if copy:
            first = (own_buf, blk.src_off, dst_buf, blk.dst_off)
            _emit_steps(b, blk, range(1), 0, ids, first, ready, rx, False, channel, after)
            if ns > 1:
                _emit_steps(b, blk, range(1, ns), 0, ids, relay, ready, rx, False, channel)
        else:
            _emit_steps(b, blk, range(ns), 0, ids, relay, ready, rx, False, channel, after)
        received = np.roll(ids, 1, axis=2)  # (S, R, m, P): into position i at each step
        done.append(received.transpose(1, 2, 0, 3).reshape(nr, m, ns * npc))
    if not done:
        return ready
    return np.concatenate([d.reshape(nr, m, -1) for d in done], axis=-1)


def ring_all_reduce(
    b: ScheduleBuilder,
    blk: RingBlocks,
    *,
    acc_buf: str,
    dst_buf: str,
    channel: int,
    ready: np.ndarray | None = None,
) -> np.ndarray:
    """Ring reduce-scatter then ring all-gather into ``dst_buf``; returns per-position done ids.

    The reduce-scatter finishes in place in ``acc_buf`` (the last hop is a fused receive-reduce,
    like every other), and the all-gather's first step sends each owner's reduced block straight
    from there while the owner copies it into its own ``dst_buf`` on the side -- NCCL's
    recvReduceCopySend. So the critical path is ``2(n-1)`` transfers and nothing else, and the
    time is exactly the textbook ``2(n-1)(a + S/(nB))`` when the network is the bottleneck. (The
    side copy stays off that path while the GPU copies faster than ``1/(n-1)`` of the link rate,
    as every real GPU does; the engine would show it on a system with slower memory, the
    analytic model leaves it out.)
    """
    acc_blk = RingBlocks(blk.ranks, blk.count, blk.src_off, blk.src_off)
    rs = ring_reduce_scatter(
        b, acc_blk, acc_buf=acc_buf, dst_buf=acc_buf, channel=channel, ready=ready
    )
    # The all-gather's first send from position i needs the data that completes i's block, and
    # follows i's last reduce-scatter send (the hop into i + 1) on the same connection: its
    # latency overlaps that send's bytes (``after``, as every other step; not a dependency).
    follows = np.roll(rs, -1, axis=1) if rs.shape[1] > 1 else None
    ag = ring_all_gather(b, blk, own_buf=acc_buf, dst_buf=dst_buf, channel=channel, ready=rs,
                         after=follows)  # fmt: skip
    return np.concatenate([rs, ag], axis=-1)


# -- builders ---------------------------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def _mesh_walks(layout: RankLayout, channels: int) -> tuple[np.ndarray, ...]:
    """Per channel, the path through a mesh node: along one of the node's direct-link cycles
    (``local_rings``), entering at local ``a = c * g // C`` (so entries take the GPUs, and their
    NICs, in turn) and leaving at a neighbour of ``a`` on it, in either direction. Of those
    walks it takes the one whose exit GPU fewer channels left through so far, then the one whose
    busiest link fewer channels cross, then the channel's own cycle backwards: exits spread over
    the GPUs and their NICs as entries do, and channels over the mesh's links, as NCCL's ring
    search balances them."""
    g = layout.ranks_per_node
    rings = [np.asarray(r, dtype=np.int64) for r in layout.local_rings or ()]
    steps = np.arange(g)
    exits = np.zeros(g, dtype=np.int64)
    crossing = np.zeros((g, g), dtype=np.int64)  # channels per directed link inside a node
    walks = []
    for c in range(channels):
        a = layout.entry(c, channels)
        own = c % len(rings)
        options = []
        for cycle in [rings[own], *rings[:own], *rings[own + 1 :]]:
            k = int(np.flatnonzero(cycle == a)[0])
            options += [cycle[(k - steps) % g], cycle[(k + steps) % g]]
        walk = min(options, key=lambda w: (exits[w[-1]], crossing[w[:-1], w[1:]].max()))
        exits[walk[-1]] += 1
        crossing[walk[:-1], walk[1:]] += 1
        walk.flags.writeable = False  # cached: shared by every caller
        walks.append(walk)
    return tuple(walks)


def ring_order(spec: BuildSpec, channel: int) -> np.ndarray:
    """The ranks in ring order for ``channel``, shape ``(1, n)``.

    Across several nodes the ring enters and leaves every node through GPUs with the same local
    index as its neighbours, so each inter-node hop joins two GPUs of one rail (one NIC index):
    channel ``c`` of ``C`` starts at local ``a = c * g // C``; even nodes run ``a, a-1, ..., a+1``
    and odd nodes the reverse, ``a+1, a+2, ..., a`` (indices mod ``g``). Hops between nodes thus
    stay on rails ``a`` and ``a + 1``, like NCCL's rings on rail-optimized clusters, and different
    channels use different NICs. (With an odd number of nodes the closing hop changes rail.)
    On one node whose GPUs form a mesh of direct links, channel ``c`` takes the layout's
    ``local_rings[c]`` (other links for other channels, as NCCL's ring search on such nodes).
    Across nodes such a mesh keeps the pattern above along that cycle instead of along local
    indices (:func:`_mesh_walks`), so every hop inside a node is a direct link (on a DGX-1's
    hybrid cube-mesh, GPU 0 -> 7 would cross PCIe and the CPUs, as NCCL's rings never do) and
    nodes still meet on the same two GPUs.
    A partial last node continues the pattern on its own ranks (indices mod its size); inside
    one node the order is plain rank order.
    """
    n, g = spec.nranks, spec.layout.ranks_per_node
    order = np.arange(n, dtype=np.int64)
    full_nodes = n // g
    rings = spec.layout.local_rings
    if rings and g >= 2 and n == g:
        return np.asarray(rings[channel % len(rings)], dtype=np.int64)[None, :]
    if g < 2 or n <= g or (full_nodes < 2 and rings):
        return order[None, :]
    even = _mesh_walks(spec.layout, spec.channels)[channel] if rings else None
    if even is None:
        even = (spec.layout.entry(channel, spec.channels) - np.arange(g)) % g
    odd = even[::-1]
    local = np.where((np.arange(full_nodes) % 2 == 0)[:, None], even[None, :], odd[None, :])
    order[: full_nodes * g] = (np.arange(full_nodes)[:, None] * g + local).ravel()
    last = n - full_nodes * g
    if last > 1 and not rings:
        # A partial last node continues the pattern on its own ranks: entered on the rail the
        # previous node left by (mod its size), so each channel crosses to it through its own
        # NIC; in plain rank order every channel would share the hop 0 -> last on one NIC.
        start = int(even[-1] if full_nodes % 2 else even[0]) % last
        step = 1 if full_nodes % 2 else -1
        order[full_nodes * g :] = full_nodes * g + (start + step * np.arange(last)) % last
    return order[None, :]


def build_all_reduce(spec: BuildSpec) -> Schedule:
    """Ring all-reduce: ``2(n-1)`` steps per channel, one ``count/n`` transfer per rank and step."""
    b = ScheduleBuilder()
    n = spec.nranks
    for c, lo, cnt in spec.channel_pieces(spec.count):
        offs, cnts = split_even(cnt, n)
        blk = RingBlocks.of(ring_order(spec, c), cnts[None], lo + offs[None], lo + offs[None])
        ring_all_reduce(b, blk, acc_buf="input", dst_buf="output", channel=c)
    return spec.finish(b)


def build_reduce_scatter(spec: BuildSpec) -> Schedule:
    """Ring reduce-scatter: ``n-1`` steps; block ``r`` of the sum ends on rank ``r``."""
    b = ScheduleBuilder()
    blk_n = spec.block
    for c, lo, cnt in spec.channel_pieces(blk_n):
        ranks = ring_order(spec, c)
        blk = RingBlocks.of(ranks, cnt, ranks * blk_n + lo, np.full(ranks.shape, lo))
        ring_reduce_scatter(b, blk, acc_buf="input", dst_buf="output", channel=c)
    return spec.finish(b)


def build_all_gather(spec: BuildSpec) -> Schedule:
    """Ring all-gather: ``n-1`` steps; rank ``r``'s input circulates into block ``r`` everywhere."""
    b = ScheduleBuilder()
    blk_n = spec.block
    for c, lo, cnt in spec.channel_pieces(blk_n):
        ranks = ring_order(spec, c)
        blk = RingBlocks.of(ranks, cnt, np.full(ranks.shape, lo), ranks * blk_n + lo)
        ring_all_gather(b, blk, own_buf="input", dst_buf="output", channel=c)
    return spec.finish(b)
