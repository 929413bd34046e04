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


# The comparisons and swaps are written out in each loop: a helper taking the arrays would count
# a reference on each, an atomic operation per call, at every step.
@numba.njit(cache=True)
def sift_up(t, k, i):
    """Restore the heap after writing a new entry at index ``i`` (the old size)."""
    rows = k.shape[0]
    while i > 0:
        p = (i - 1) // 2
        if not (t[i] < t[p] or (t[i] == t[p] and k[0, i] < k[0, p])):
            break
        t[i], t[p] = t[p], t[i]
        for r in range(rows):
            k[r, i], k[r, p] = k[r, p], k[r, i]
        i = p


@numba.njit(cache=True)
def pop(t, k, n):
    """Move the first of the ``n`` entries to index ``n - 1`` and restore the heap before it."""
    rows = k.shape[0]
    n -= 1
    t[0], t[n] = t[n], t[0]
    for r in range(rows):
        k[r, 0], k[r, n] = k[r, n], k[r, 0]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        d = c + 1
        if d < n and (t[d] < t[c] or (t[d] == t[c] and k[0, d] < k[0, c])):
            c = d
        if not (t[c] < t[i] or (t[c] == t[i] and k[0, c] < k[0, i])):
            break
        t[i], t[c] = t[c], t[i]
        for r in range(rows):
            k[r, i], k[r, c] = k[r, c], k[r, i]
        i = c
