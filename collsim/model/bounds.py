"""Bus-bandwidth bounds: the most busbw a schedule can reach on a topology, from its links alone.

Every byte a schedule puts on a link crosses it at no more than the link's capacity, so a
collective of ``S`` bytes takes at least ``max over links (wire bytes on it / capacity)`` -- the
analytic model's link-load lines, ``b`` seconds per collective byte on the busiest link -- and its
bus bandwidth is at most ``bus_factor / b`` at every size (the latencies only lower it). Every
channel's flow moves at most its NCCL channel's rate (:mod:`collsim.channel_rates`), so the
model's lines include, per wave, its slowest flow's bytes at that ceiling. For a ring all-gather
on two p5 nodes that is 8 NICs x 50 GB/s = 400 GB/s with 16 channels, 8 x 38.7 = 309.6 GB/s
with 8 (an H100 channel's 38.7 GB/s).

The bound is per (collective, algorithm, protocol, channels) -- exactly what a printed row names:
the protocol sets the wire bytes (LL puts two on the wire per byte of data), the channel count
which NICs and links the schedule spreads over (a one-channel ring leaves a node through one
NIC). The discrete-event engine shares those same link capacities among the flows that cross
them, so it never exceeds the bound (``tests/model/test_bounds.py`` checks it on the catalog); a
cost model that is not built on the links can -- NCCL's tuning model, which prices a channel by
the bandwidth of NCCL's topology search, or a calibration profile -- and the CLI flags where it
does (:data:`BOUND_TOLERANCE` above it).

The links are the topology's as given (a profile's efficiencies are not applied): the bound is
what the hardware allows, not what a calibration predicts.
"""

from __future__ import annotations

from dataclasses import dataclass

from collsim.errors import ScheduleError
from collsim.metrics import bus_factor, busbw_gbps
from collsim.model.analytic import AnalyticModel

BOUND_TOLERANCE = 0.01
"""How far (relative) a busbw may pass its bound before it is flagged: rounding, not physics."""


@dataclass(frozen=True)
class BusbwBound:
    """The most busbw one (collective, algorithm, protocol, channels) can reach here."""

    collective: str
    algorithm: str
    protocol: str
    channels: int
    busbw_gbps: float

    def label(self) -> str:
        return f"{self.algorithm}/{self.protocol}/{self.channels}ch"

    def exceeded_by(self, busbw_gbps: float) -> bool:
        """Whether ``busbw_gbps`` is above this bound by more than :data:`BOUND_TOLERANCE`."""
        return bool(busbw_gbps > self.busbw_gbps * (1.0 + BOUND_TOLERANCE))


class BusbwBounds:
    """Bounds of one topology, cached per configuration.

    ``model``: an :class:`AnalyticModel` of the topology with the default parameters (the links
    as given; see the module docstring). Only its link loads are built (no critical path), so a
    bound costs a fraction of one analytic prediction.
    """

    def __init__(self, model: AnalyticModel) -> None:
        self.model = model
        self._found: dict[tuple[str, str, str, int], BusbwBound | None] = {}

    def bound(
        self, collective: str, algorithm: str, protocol: str = "Simple", channels: int = 1
    ) -> BusbwBound | None:
        """The bound, or None where there is none to compute: a lone rank (no links), a
        collective whose busbw is 0 by definition, or a configuration this system cannot run."""
        key = (collective, algorithm, str(protocol), int(channels))
        if key not in self._found:
            self._found[key] = self._compute(*key)
        return self._found[key]

    def _compute(
        self, collective: str, algorithm: str, protocol: str, channels: int
    ) -> BusbwBound | None:
        n = self.model.nranks
        factor = bus_factor(collective, n)
        if n < 2 or factor == 0.0:
            return None
        try:
            lines = self.model.load_lines(
                collective, algorithm, protocol=protocol, channels=channels
            )
        except ScheduleError:
            return None
        s_per_byte = float(lines.b_s_per_byte.max()) if lines.b_s_per_byte.size else 0.0
        if s_per_byte <= 0.0:
            return None
        gbps = busbw_gbps(collective, n, 1.0, s_per_byte)  # a byte in its busiest link's time
        name = self.model.params.protocol(protocol).name
        return BusbwBound(collective, algorithm, name, channels, gbps)
