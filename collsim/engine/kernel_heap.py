"""A binary min-heap on arrays for the compiled replay (numba): entries ordered by a float
``t[i]`` and then an int ``k[0, i]`` (unique: a push or start number), so ties never depend on
the heap's layout. ``k``'s other rows travel with the entry.

numba's ``heapq`` on a typed list counts a reference on the list at every access, an atomic
operation per sift step; on flat arrays a push or pop is a handful of loads and stores. The
caller keeps the size and writes a new entry at index ``n`` before :func:`sift_up`; after
:func:`pop` the removed entry sits at index ``n - 1``.
"""

from __future__ import annotations

import numba


# The helpers are inlined at numba IR level: a called function would count a reference on
# each array, an atomic operation, at every step of a sift.
@numba.njit(cache=True, inline="always")
def _before(t, k, a, b):
    """Whether entry ``a`` comes before entry ``b``."""
    return t[a] < t[b] or (t[a] == t[b] and k[0, a] < k[0, b])


@numba.njit(cache=True, inline="always")
def _swap(t, k, a, b):
    t[a], t[b] = t[b], t[a]
    for r in range(k.shape[0]):
        k[r, a], k[r, b] = k[r, b], k[r, a]


@numba.njit(cache=True)
def sift_up(t, k, i):
    """Restore the heap after writing a new entry at index ``i`` (the old size)."""
    while i > 0:
        p = (i - 1) // 2
        if not _before(t, k, i, p):
            break
        _swap(t, k, i, p)
        i = p


@numba.njit(cache=True)
def pop(t, k, n):
    """Move the first of the ``n`` entries to index ``n - 1`` and restore the heap before it."""
    n -= 1
    _swap(t, k, 0, n)
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and _before(t, k, c + 1, c):
            c += 1
        if not _before(t, k, c, i):
            break
        _swap(t, k, i, c)
        i = c
