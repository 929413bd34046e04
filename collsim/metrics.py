"""algbw and busbw exactly as nccl-tests defines them: the one definition all of collsim uses.

nccl-tests (``src/*.cu``, ``GetBw`` functions; see its ``doc/PERFORMANCE.md``) reports

* ``algbw = size_bytes / time_s / 1e9`` (GB/s, 1e9 bytes/s), where ``size_bytes`` is the size
  it prints: the per-rank buffer for all_reduce, broadcast, reduce and sendrecv; the whole
  (all ranks') buffer for all_gather and reduce_scatter; the per-rank send buffer for alltoall;
* ``busbw = algbw * factor``, the factor making busbw comparable to link bandwidth:
  ``2(n-1)/n`` for all_reduce; ``(n-1)/n`` for all_gather, reduce_scatter and alltoall;
  ``1`` for broadcast, reduce and sendrecv.

The collectives' names live here too (:data:`COLLECTIVES`, :func:`canonical_collective`), on the
bottom floor, so every layer above reads a user's name for one the same way.
"""

from __future__ import annotations

import difflib
import re

import numpy as np

from collsim.errors import ScheduleError
from collsim.units import BYTES_PER_GB

COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "alltoall",
    "sendrecv",
)
"""The collectives collsim models, by their canonical (nccl-tests) names: the one list the
algorithm registry, the cost models, the CLI and the readers of logs and specs all use."""

_ALIASES = {name.replace("_", ""): name for name in COLLECTIVES} | {
    "bcast": "broadcast",
    "a2a": "alltoall",
}
NOT_MODELLED = ("gather", "scatter", "hypercube", "alltoallv")
"""Collectives nccl-tests measures (``gather_perf``, ...) that collsim does not model."""
_PERF = re.compile(r"perf(mpi)?$")


def canonical_collective(collective: object) -> str:
    """The canonical name of the collective ``collective`` calls: the one normaliser every entry
    point uses. Case, ``_``, ``-`` and spaces do not matter (``AllReduce``, ``allreduce``,
    ``all-reduce`` -> ``all_reduce``; ``all_to_all``, ``AllToAll`` -> ``alltoall``), nor does
    nccl-tests' binary suffix (``all_reduce_perf``, ``sendrecv_perf_mpi`` -> ``sendrecv``).

    Raises ``ScheduleError`` naming the value: for a collective nccl-tests has that collsim does
    not model (``gather_perf``), saying so; otherwise with a "did you mean" where a name is
    close. Both list the collectives collsim models.
    """
    key = re.sub(r"[\s_-]+", "", str(collective).lower())
    key = _PERF.sub("", key) or key
    if key in _ALIASES:
        return _ALIASES[key]
    supported = f"supported: {', '.join(COLLECTIVES)}"
    if key in NOT_MODELLED:
        message = f"{key} (nccl-tests' {key}_perf) is not supported by collsim ({supported})"
    else:
        close = difflib.get_close_matches(key, list(_ALIASES), n=1, cutoff=0.7)
        hint = f"; did you mean {_ALIASES[close[0]]!r}?" if close else ""
        message = f"unknown collective{hint} ({supported})"
    raise ScheduleError(message, field="collective", value=collective)


def bus_factor(collective: str, nranks: int) -> float:
    """nccl-tests' busbw/algbw factor for ``collective`` on ``nranks`` ranks."""
    if int(nranks) < 1:
        raise ScheduleError("nranks must be at least 1", field="nranks", value=nranks)
    n = int(nranks)
    name = canonical_collective(collective)
    if name == "all_reduce":
        return 2.0 * (n - 1) / n
    if name in ("all_gather", "reduce_scatter", "alltoall"):
        return (n - 1) / n
    return 1.0


def algbw_gbps(size_bytes: float, time_s: float) -> float:
    """``size_bytes / time_s`` in GB/s (1e9 bytes/s); ``inf`` for a positive size in zero time,
    0 for a zero size."""
    if time_s < 0:
        raise ScheduleError("time must be non-negative", field="time_s", value=time_s)
    if size_bytes == 0:
        return 0.0
    if time_s == 0:
        return float("inf")
    return size_bytes / time_s / BYTES_PER_GB


def busbw_gbps(collective: str, nranks: int, size_bytes: float, time_s: float) -> float:
    """nccl-tests' bus bandwidth in GB/s: ``algbw * bus_factor`` (0 when the factor is 0)."""
    factor = bus_factor(collective, nranks)
    if factor == 0.0:
        return 0.0
    return algbw_gbps(size_bytes, time_s) * factor


ROUNDED_TO_RANKS = frozenset({"all_gather", "reduce_scatter", "alltoall"})
"""Collectives whose element count nccl-tests rounds down to a multiple of the rank count."""


def effective_bytes(
    collective: str, sizes_bytes: np.ndarray, elem_bytes: int, nranks: int
) -> np.ndarray:
    """The bytes nccl-tests actually moves for each requested size (whole elements, rounded to a
    multiple of the ranks for the blocked collectives)."""
    count = np.asarray(sizes_bytes, dtype=np.int64) // elem_bytes
    if collective in ROUNDED_TO_RANKS:
        count = count // nranks * nranks
    return (count * elem_bytes).astype(np.float64)
