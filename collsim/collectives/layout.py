"""Where ranks live: nodes of ``ranks_per_node`` GPUs, and an optional logical grid.

Ranks are numbered node-major, as launchers (torchrun, mpirun with ``--map-by node``-less defaults)
and NCCL's own rank files number them: rank ``r`` is local rank ``r % ranks_per_node`` of node
``r // ranks_per_node``. The last node may be partial when ``nranks`` is not a multiple of
``ranks_per_node``. Hierarchical algorithms use the node structure; 2D-ring/torus algorithms use
``grid`` (row-major: rank ``r`` is at row ``r // cols``, column ``r % cols``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from collsim.errors import ScheduleError

DEFAULT_RANKS_PER_NODE = 8


@dataclass(frozen=True)
class RankLayout:
    """``nranks`` ranks on nodes of ``ranks_per_node``; ``grid`` optionally shapes them."""

    nranks: int
    ranks_per_node: int
    grid: tuple[int, ...] | None = None
    local_rings: tuple[tuple[int, ...], ...] | None = None
    """Per channel (in turn), the order of a node's local indices around its rings, where the
    topology calls for other orders than rank order (point-to-point meshes,
    :func:`collsim.topology.rings.mesh_rings`); ``None``: rank order."""

    def __post_init__(self) -> None:
        if not _is_int(self.nranks) or self.nranks < 1:
            raise ScheduleError("nranks must be an integer >= 1", field="nranks", value=self.nranks)
        if not _is_int(self.ranks_per_node) or self.ranks_per_node < 1:
            raise ScheduleError(
                "ranks_per_node must be an integer >= 1",
                field="layout.ranks_per_node",
                value=self.ranks_per_node,
            )
        if self.grid is not None:
            grid = tuple(self.grid)
            if not grid or any(not _is_int(g) or g < 1 for g in grid):
                raise ScheduleError(
                    "grid dimensions must be integers >= 1", field="layout.grid", value=self.grid
                )
            if math.prod(grid) != self.nranks:
                raise ScheduleError(
                    f"grid {grid} has {math.prod(grid)} positions, not {self.nranks}",
                    field="layout.grid",
                    value=self.grid,
                )
            object.__setattr__(self, "grid", grid)
        if self.local_rings is not None:
            rings = tuple(tuple(int(x) for x in r) for r in self.local_rings)
            want = list(range(self.ranks_per_node))
            if not rings or any(sorted(r) != want for r in rings):
                raise ScheduleError(
                    f"each ring must order the local indices 0..{self.ranks_per_node - 1}",
                    field="layout.local_rings",
                    value=self.local_rings,
                )
            object.__setattr__(self, "local_rings", rings)

    @classmethod
    def default(cls, nranks: int, ranks_per_node: int = DEFAULT_RANKS_PER_NODE) -> RankLayout:
        """``nranks`` ranks on (DGX-like) nodes of ``ranks_per_node``, capped at ``nranks``."""
        return cls(nranks=nranks, ranks_per_node=max(1, min(ranks_per_node, nranks)))

    @property
    def nnodes(self) -> int:
        return -(-self.nranks // self.ranks_per_node)

    @property
    def last_node_size(self) -> int:
        """Ranks on the last node (``ranks_per_node`` unless the last node is partial)."""
        return self.nranks - (self.nnodes - 1) * self.ranks_per_node

    def local_cycle(self, channel: int) -> np.ndarray:
        """A node's local indices in the cyclic order ``channel``'s ring and tree chain follow
        inside it: its direct-link cycle (:attr:`local_rings`) on a mesh, else ``0..g-1``."""
        if self.local_rings:
            return np.asarray(self.local_rings[channel % len(self.local_rings)], dtype=np.int64)
        return np.arange(self.ranks_per_node, dtype=np.int64)

    def entry(self, channel: int, channels: int) -> int:
        """The local index where ``channel`` of ``channels`` enters each node (its ring) or hangs
        its tree chain: ``c * g // C``, so channels take the GPUs, and their NICs, in turn."""
        return (channel * self.ranks_per_node // channels) % self.ranks_per_node

    def node_of(self, rank: int) -> int:
        return rank // self.ranks_per_node

    def local_of(self, rank: int) -> int:
        return rank % self.ranks_per_node

    def node_size(self, node: int) -> int:
        return self.last_node_size if node == self.nnodes - 1 else self.ranks_per_node

    def grid2d(self) -> tuple[int, int]:
        """``grid`` as (rows, cols); a near-square grid when none was given."""
        if self.grid is None:
            return near_square_grid(self.nranks)
        if len(self.grid) != 2:
            raise ScheduleError(
                "a 2D algorithm needs a 2-dimensional grid", field="layout.grid", value=self.grid
            )
        return self.grid[0], self.grid[1]


def near_square_grid(n: int) -> tuple[int, int]:
    """(rows, cols) with rows * cols == n and rows the largest divisor of n not above sqrt(n).

    Primes give (1, n): a 2D ring on a prime count degenerates to a plain ring.
    """
    if n < 1:
        raise ScheduleError("nranks must be an integer >= 1", field="nranks", value=n)
    rows = math.isqrt(n)
    while n % rows:
        rows -= 1
    return rows, n // rows


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)
