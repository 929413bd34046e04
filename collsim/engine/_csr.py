"""Small vectorised helpers for CSR (``ptr``/``idx``) arrays, shared by the engine's modules."""

from __future__ import annotations

import numpy as np

_EMPTY = np.zeros(0, dtype=np.int64)


def gather_rows(ptr: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions into ``idx`` of the rows ``rows`` concatenated, and each row's length.

    ``idx[positions]`` is the rows' entries in order; ``lengths`` says how many belong to each.
    Done with one ``repeat``/``arange`` instead of a Python loop over rows.
    """
    starts = ptr[rows]
    lengths = ptr[rows + 1] - starts
    total = int(lengths.sum())
    if total == 0:
        return _EMPTY, lengths
    ends = np.cumsum(lengths)
    positions = np.repeat(starts - (ends - lengths), lengths) + np.arange(total, dtype=np.int64)
    return positions, lengths


def ptr_from_lengths(lengths: np.ndarray) -> np.ndarray:
    """A CSR ``ptr`` (length ``len(lengths) + 1``, starting at 0) for rows of ``lengths``."""
    ptr = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=ptr[1:])
    return ptr


def subset(ptr: np.ndarray, idx: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The CSR ``(ptr, idx)`` of only ``rows`` (in that order, repeats allowed)."""
    positions, lengths = gather_rows(ptr, np.asarray(rows, dtype=np.int64))
    return ptr_from_lengths(lengths), idx[positions]
