"""Shared helpers for the collective tests."""

from __future__ import annotations

import dataclasses

import numpy as np

from collsim.collectives.layout import RankLayout
from collsim.collectives.registry import COLLECTIVES, algorithms_for
from collsim.collectives.schedule import TRANSFER, Schedule

NRANKS = (1, 2, 3, 4, 5, 7, 8, 12, 16, 33)
PAIRS = tuple((c, a) for c in COLLECTIVES for a in algorithms_for(c))


def layouts_for(algorithm: str, n: int) -> list[RankLayout | None]:
    """The layouts worth testing: node sizes for hierarchical, grids for ring2d."""
    if algorithm == "hierarchical":
        return [RankLayout(n, rpn) for rpn in (1, 4, 8)]
    if algorithm == "ring2d":
        grids = {(1, n), (n, 1)}
        grids |= {(r, n // r) for r in (2, 3, 4) if n % r == 0}
        return [None, *(RankLayout(n, 8, grid=g) for g in sorted(grids))]
    return [None]


def network_bytes(s: Schedule) -> np.ndarray:
    """Bytes each rank sends to *other* ranks (local copies excluded)."""
    a = s.arrays
    mask = (a["kind"] == TRANSFER) & (a["src"] != a["dst"])
    return np.bincount(
        a["src"][mask], weights=a["count"][mask].astype(np.int64) * s.elem_bytes, minlength=s.nranks
    )


def with_arrays(s: Schedule, **changes: np.ndarray) -> Schedule:
    """A copy of ``s`` with some columns replaced."""
    arrays = dict(s.arrays)
    arrays.update(changes)
    return dataclasses.replace(s, arrays=arrays)


def without_dep(s: Schedule, op: int, dep: int) -> Schedule:
    """A copy of ``s`` where ``op`` no longer depends on ``dep``."""
    owner = np.repeat(np.arange(len(s)), np.diff(s.dep_ptr))
    keep = ~((owner == op) & (s.dep_idx == dep))
    counts = np.bincount(owner[keep], minlength=len(s))
    ptr = np.zeros(len(s) + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    return dataclasses.replace(s, dep_ptr=ptr, dep_idx=s.dep_idx[keep])
