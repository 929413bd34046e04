"""What a simulation returns: flat, column-wise records of transfers, links, ranks and totals.

Records are numpy columns, never one Python object per row: a 1024-rank ring all-reduce has two
million transfers. Paths are stored once per distinct route (CSR ``route_ptr``/``route_links``)
and referenced by each transfer's ``route``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from collsim.errors import ScheduleError
from collsim.metrics import algbw_gbps, bus_factor, busbw_gbps


@dataclass(frozen=True, eq=False)
class TransferRecords:
    """One row per TRANSFER operation (local copies included, with an empty path).

    ``start_s`` is when the transfer's dependencies were met (its latency begins),
    ``flow_start_s`` when its bytes started to flow, ``end_s`` when it completed (for a fused
    receive-reduce, including the reduction). ``bytes`` is payload, ``wire_bytes`` what the
    protocol puts on the wire.
    """

    op_id: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    bytes: np.ndarray
    wire_bytes: np.ndarray
    start_s: np.ndarray
    flow_start_s: np.ndarray
    end_s: np.ndarray
    route: np.ndarray
    route_ptr: np.ndarray
    route_links: np.ndarray

    def __len__(self) -> int:
        return int(self.op_id.shape[0])

    def path(self, i: int) -> np.ndarray:
        """Link ids crossed by transfer row ``i``."""
        r = int(self.route[i])
        return self.route_links[self.route_ptr[r] : self.route_ptr[r + 1]]

    def path_csr(self) -> tuple[np.ndarray, np.ndarray]:
        """Every transfer's path as one CSR ``(ptr, link_ids)`` (expanded; memory ~ total hops)."""
        lengths = np.diff(self.route_ptr)[self.route]
        ptr = np.zeros(len(self) + 1, dtype=np.int64)
        np.cumsum(lengths, out=ptr[1:])
        starts = self.route_ptr[self.route]
        pos = np.repeat(starts - ptr[:-1], lengths) + np.arange(int(ptr[-1]), dtype=np.int64)
        return ptr, self.route_links[pos]


@dataclass(frozen=True, eq=False)
class LinkRecords:
    """One row per directed link: wire bytes carried, time with at least one flow on it, and
    ``utilization`` = bytes / (capacity x collective time), ``busy_fraction`` = busy / time."""

    name: tuple[str, ...]
    capacity_bytes_per_s: np.ndarray
    bytes: np.ndarray
    busy_s: np.ndarray
    utilization: np.ndarray
    busy_fraction: np.ndarray

    def __len__(self) -> int:
        return len(self.name)


@dataclass(frozen=True, eq=False)
class SimResult:
    """A simulated collective: its time, nccl-tests bandwidths and the detailed records."""

    collective: str
    algorithm: str
    nranks: int
    size_bytes: int
    protocol: str
    time_s: float
    transfers: TransferRecords
    links: LinkRecords
    rank_finish_s: np.ndarray
    op_start_s: np.ndarray
    op_end_s: np.ndarray
    meta: dict = field(default_factory=dict)

    @property
    def algbw_gbps(self) -> float:
        """nccl-tests' algbw: size / time in GB/s (1e9 bytes/s)."""
        return algbw_gbps(self.size_bytes, self.time_s)

    @property
    def busbw_gbps(self) -> float:
        """nccl-tests' busbw: algbw x the collective's bus factor."""
        return busbw_gbps(self.collective, self.nranks, self.size_bytes, self.time_s)

    @property
    def bus_factor(self) -> float:
        return bus_factor(self.collective, self.nranks)

    def summary(self) -> dict[str, float | int | str]:
        """The headline numbers as a plain dict (for printing or JSON); busbw is NaN for a
        collective nccl-tests does not define."""
        try:
            busbw = self.busbw_gbps
        except ScheduleError:
            busbw = float("nan")
        return {
            "collective": self.collective,
            "algorithm": self.algorithm,
            "protocol": self.protocol,
            "nranks": self.nranks,
            "size_bytes": self.size_bytes,
            "time_s": self.time_s,
            "algbw_gbps": self.algbw_gbps,
            "busbw_gbps": busbw,
            "transfers": len(self.transfers),
        }


class LinkStat(NamedTuple):
    """One row of :func:`bottleneck_links`."""

    link_id: int
    name: str
    utilization: float
    bytes: float
    busy_fraction: float


def bottleneck_links(result: SimResult, top: int = 5) -> list[LinkStat]:
    """The ``top`` links by utilization (ties broken by bytes carried, then by name), busiest
    first.

    Links that carried nothing are left out. Utilizations are compared rounded to 9 decimals
    (bytes to whole bytes), so the order of a topology file's links, which sets the order of
    floating-point sums, does not change which of two equally busy links is listed first.
    """
    links = result.links
    used = np.flatnonzero(links.bytes > 0)
    names = np.array([links.name[i] for i in used], dtype=object)
    util = np.round(links.utilization[used], 9)
    carried = np.round(links.bytes[used], 0)
    order = used[np.lexsort((names, -carried, -util))][: max(top, 0)]
    return [
        LinkStat(
            int(i),
            links.name[i],
            float(links.utilization[i]),
            float(links.bytes[i]),
            float(links.busy_fraction[i]),
        )
        for i in order
    ]
