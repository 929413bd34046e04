"""Shared helpers for engine tests: an ideal protocol and small hand-built fabrics."""

from __future__ import annotations

import pytest

from collsim.engine.fabric import Link, SimpleFabric
from collsim.protocols import Protocol

IDEAL = Protocol("ideal", 1.0, 0.0)
"""No protocol overhead: timings are then pure link latency + bytes / rate."""

REL = 1e-9


@pytest.fixture
def ideal() -> Protocol:
    return IDEAL


def switch_fabric(
    caps_in: list[float], caps_out: list[float], lat: float = 0.0, **kwargs: object
) -> SimpleFabric:
    """Ranks 0..n-1, each with an uplink (``caps_in[r]``) to and a downlink (``caps_out[r]``)
    from one switch ``"sw"``; link ids: uplink of r is ``2r``, downlink ``2r + 1``."""
    links = []
    for r, (up, down) in enumerate(zip(caps_in, caps_out, strict=True)):
        links += [Link(r, "sw", up, lat), Link("sw", r, down, lat)]
    return SimpleFabric(len(caps_in), links, **kwargs)  # type: ignore[arg-type]
