"""Ready-made :class:`SimpleFabric` shapes for tests, examples and benchmarks.

Each builder takes one link bandwidth (bytes/s) and one link latency (s) for every cable; cables
are full duplex (two directed links) unless stated. ``memory_bytes_per_s`` (default infinite)
sets the GPUs' local reduction and copy rates as in :class:`SimpleFabric`.
"""

from __future__ import annotations

import numpy as np

from collsim.engine.fabric import Link, Node, SimpleFabric, duplex
from collsim.errors import ScheduleError
from collsim.protocols import HW_NVLINK

_INF = float("inf")


def _check(n: int, bw: float, lat: float) -> None:
    if n < 1:
        raise ScheduleError("need at least one rank", field="nranks", value=n)
    if not bw > 0 or lat < 0:
        raise ScheduleError("need bandwidth > 0 and latency >= 0", field="fabric")


def ring_fabric(
    n: int,
    bw: float,
    lat: float,
    *,
    bidirectional: bool = True,
    kind: int = HW_NVLINK,
    memory_bytes_per_s: float | np.ndarray = _INF,
) -> SimpleFabric:
    """Ranks on a ring: link ``i -> i+1`` (and ``i+1 -> i`` if bidirectional), disjoint links.

    Routes go the shorter way round (forward on ties; always forward when unidirectional) and
    are computed in closed form, so a 1024-rank ring needs no graph search.
    """
    _check(n, bw, lat)
    links: list[Link] = []
    if n == 2:
        links = duplex(0, 1, bw, lat, kind)
    elif n > 2:
        links = [Link(i, (i + 1) % n, bw, lat, kind) for i in range(n)]
        if bidirectional:
            links += [Link((i + 1) % n, i, bw, lat, kind) for i in range(n)]

    def router(src: Node, dst: Node) -> list[Node]:
        s, d = int(src), int(dst)  # type: ignore[call-overload]
        forward = (d - s) % n
        if not bidirectional or n == 2 or forward <= n - forward:
            return [(s + k) % n for k in range(forward + 1)]
        return [(s - k) % n for k in range(n - forward + 1)]

    return SimpleFabric(n, links, router=router, memory_bytes_per_s=memory_bytes_per_s)


def star_fabric(
    n: int,
    bw: float,
    lat: float,
    switch_latency: float = 0.0,
    *,
    reducing: bool = False,
    kind: int = HW_NVLINK,
    memory_bytes_per_s: float | np.ndarray = _INF,
) -> SimpleFabric:
    """Every rank cabled to one switch ``"sw"``; a route ``a -> sw -> b`` costs
    ``2 * lat + switch_latency``. With ``reducing`` the switch can reduce in-network
    (NVLink SHARP / SHARP)."""
    _check(n, bw, lat)
    switch = "sw"
    links = [link for r in range(n) for link in duplex(r, switch, bw, lat, kind)]

    def router(src: Node, dst: Node) -> list[Node]:
        if src == switch or dst == switch:
            return [src, dst]
        return [src, switch, dst]

    return SimpleFabric(
        n,
        links,
        node_latency_s={switch: switch_latency},
        router=router,
        reducing_switch=switch if reducing else None,
        memory_bytes_per_s=memory_bytes_per_s,
    )


def full_mesh_fabric(
    n: int,
    bw: float,
    lat: float,
    *,
    kind: int = HW_NVLINK,
    memory_bytes_per_s: float | np.ndarray = _INF,
) -> SimpleFabric:
    """A direct cable between every pair of ranks (an all-to-all NVLink box without a switch)."""
    _check(n, bw, lat)
    links = [Link(a, b, bw, lat, kind) for a in range(n) for b in range(n) if a != b]
    return SimpleFabric(n, links, router=lambda s, d: [s, d], memory_bytes_per_s=memory_bytes_per_s)
