"""Small vectorised helpers for CSR (``ptr``/``idx``) arrays, shared by the engine's modules."""

from __future__ import annotations

import numpy as np

_EMPTY = np.zeros(0, dtype=np.int64)


def gather_rows(ptr: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions into ``idx`` of the rows ``rows`` concatenated, and each row's length.

    ``idx[positions]`` is the rows' entries in order; ``lengths`` says how many belong to each.
    Done with one ``repeat``/``arange`` instead of a Python loop over rows. The replay calls
    this for batches of a few rows hundreds of thousands of times, so it uses array methods
    (numpy's function forms add a wrapper call each) and handles a single row directly.
    """
    starts = ptr[rows]
    lengths = ptr[rows + 1] - starts
    if rows.shape[0] == 1:
        lo = int(starts[0])
        return np.arange(lo, lo + int(lengths[0]), dtype=np.int64), lengths
    total = int(lengths.sum())
    if total == 0:
        return _EMPTY, lengths
    ends = lengths.cumsum()
    positions = (starts - (ends - lengths)).repeat(lengths) + np.arange(total, dtype=np.int64)
    return positions, lengths


def ptr_from_lengths(lengths: np.ndarray, dtype: np.dtype | type = np.int64) -> np.ndarray:
    """A CSR ``ptr`` (length ``len(lengths) + 1``, starting at 0) for rows of ``lengths``;
    ``dtype`` must hold their sum."""
    ptr = np.zeros(len(lengths) + 1, dtype=dtype)
    np.cumsum(lengths, dtype=ptr.dtype, out=ptr[1:])
    return ptr


def subset(ptr: np.ndarray, idx: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The CSR ``(ptr, idx)`` of only ``rows`` (in that order, repeats allowed)."""
    positions, lengths = gather_rows(ptr, np.asarray(rows, dtype=np.int64))
    return ptr_from_lengths(lengths), idx[positions]
