"""Derived metrics of simulated and measured collectives (algbw, busbw, ...)."""

from collsim.analysis.metrics import (
    COLLECTIVES,
    algbw_gbps,
    bus_factor,
    busbw_gbps,
    canonical_collective,
)

__all__ = ["COLLECTIVES", "algbw_gbps", "bus_factor", "busbw_gbps", "canonical_collective"]
