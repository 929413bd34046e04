"""NCCL's wire protocols as data: what fraction of the wire carries payload, and per-hop latency.

NCCL moves data with one of three protocols (``NCCL_PROTO``):

* ``LL`` (low latency): each 8-byte line carries 4 bytes of data and a 4-byte flag, so half the
  wire bytes are payload (``bandwidth_fraction = 0.5``); no separate synchronisation, so the
  lowest latency.
* ``LL128``: each 128-byte line carries 120 bytes of data and 8 bytes of flags
  (``120 / 128 = 0.9375``).
* ``Simple``: plain bulk copies with a memory fence and a flag per chunk: full bandwidth (1.0)
  but the highest per-hop latency.

Per-hop latencies come from NCCL's tuning model, ``src/graph/tuning.cc``, table
``hwLat[hw][NCCL_ALGO_RING][proto]`` (microseconds), NCCL v2.19-v2.21 (the Ring row is unchanged
across those releases; read from the NVIDIA/nccl sources)::

    NVLink: LL 0.6   LL128 1.9   Simple 3.4
    PCI:    LL 1.0   LL128 2.5   Simple 5.7
    NET:    LL 2.7   LL128 4.0   Simple 14.0

NCCL charges that latency once per ring step; collsim charges it once per transfer (a transfer
is one step of one channel), choosing the row by the slowest kind of link on the transfer's path
(see :data:`HW_NVLINK`, :data:`HW_PCI`, :data:`HW_NET`). NCCL's ``baseLat`` (a per-launch
constant) is not a per-hop cost and is left to the caller.

How ``hwLat`` and a route's datasheet latency combine (:func:`step_latency_s`): ``hwLat`` is
NCCL's *end-to-end* cost of one step on a link of that class -- the sender's store or RDMA write,
the wire and switches of the route, the receiver's flag poll -- as measured on NVIDIA's own
systems, and NCCL adds nothing for the wire (the IB transport reports ``latency = 0`` to the
tuner, ``src/transport/net_ib.cc``; ``ncclTopoTuneModel`` adds only that reported figure,
``graphs[a]->latencyInter``). Adding the datasheet latency of the route on top therefore counts the
wire twice (a DGX H100 NVLink step: 0.6 us ``hwLat`` + ~1.8 us GPU-NVSwitch-GPU = 2.4 us, where
the 0.6 us already covers a route of that kind). A step takes the larger of the two: NCCL's
figure where the route is like the one it was measured on, the route's own latency where that is
longer (host staging, many switch hops, a fault's extra latency).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from collsim.errors import ScheduleError

HW_NVLINK, HW_PCI, HW_NET = 0, 1, 2
"""Link-kind codes, the first index of NCCL's ``hwLat`` table (NVLink, PCI, network)."""
HW_NAMES = ("nvlink", "pci", "net")

_US = 1e-6


@dataclass(frozen=True)
class Protocol:
    """A wire protocol: payload fraction of the wire bytes and the latency added per hop.

    ``hop_latency_s`` is either one number (the same for every kind of link) or a triple indexed
    by link kind ``(nvlink, pci, net)``, like NCCL's ``hwLat``. A transfer of ``S`` payload bytes
    puts ``S / bandwidth_fraction`` bytes on the wire.
    """

    name: str
    bandwidth_fraction: float
    hop_latency_s: float | tuple[float, float, float]

    def __post_init__(self) -> None:
        frac = float(self.bandwidth_fraction)
        if not 0.0 < frac <= 1.0:
            raise ScheduleError(
                "bandwidth_fraction must be in (0, 1]", field="protocol", value=frac
            )
        lat = self.hop_latency_s
        triple = (float(lat),) * 3 if np.isscalar(lat) else tuple(float(x) for x in lat)
        if len(triple) != 3 or any(not np.isfinite(x) or x < 0 for x in triple):
            raise ScheduleError(
                "hop_latency_s must be one non-negative time or three (nvlink, pci, net)",
                field="protocol",
                value=lat,
            )
        object.__setattr__(self, "bandwidth_fraction", frac)
        object.__setattr__(self, "hop_latency_s", triple)

    def hop_latency(self, link_kind: np.ndarray | int) -> np.ndarray:
        """Per-hop latency in seconds for each link-kind code in ``link_kind``."""
        table = np.asarray(self.hop_latency_s, dtype=np.float64)
        return table[np.asarray(link_kind, dtype=np.int64)]

    def wire_bytes(self, payload_bytes: np.ndarray | float) -> np.ndarray:
        """Bytes on the wire for ``payload_bytes`` of data (payload / bandwidth_fraction)."""
        return np.asarray(payload_bytes, dtype=np.float64) / self.bandwidth_fraction


def step_latency_s(
    route_latency_s: np.ndarray | float,
    hop_latency_s: np.ndarray | float,
    transport_s: np.ndarray | float = 0.0,
) -> np.ndarray:
    """Latency of one step over a route: the larger of the route's datasheet latency (links and
    forwarding devices) and the protocol's per-hop latency for its class (NCCL ``hwLat``), which
    already includes a typical route's wire time (module docstring), plus ``transport_s``, the
    per-step overhead of the net transport whose NIC the route crosses (0 for IB/RoCE verbs;
    :mod:`collsim.transports`), which NCCL too adds on top of ``hwLat`` (its plugin latency).
    The engine (:mod:`collsim.engine.prepare`) and the analytic model
    (:mod:`collsim.model.flows`) both charge this, so they agree."""
    return np.maximum(
        np.asarray(route_latency_s, dtype=np.float64), np.asarray(hop_latency_s, dtype=np.float64)
    ) + np.asarray(transport_s, dtype=np.float64)


LL = Protocol("LL", 0.5, (0.6 * _US, 1.0 * _US, 2.7 * _US))
LL128 = Protocol("LL128", 120.0 / 128.0, (1.9 * _US, 2.5 * _US, 4.0 * _US))
SIMPLE = Protocol("Simple", 1.0, (3.4 * _US, 5.7 * _US, 14.0 * _US))

PROTOCOLS: dict[str, Protocol] = {p.name.lower(): p for p in (LL, LL128, SIMPLE)}


def get_protocol(name: str | Protocol) -> Protocol:
    """The protocol called ``name`` (LL, LL128, Simple; any case); a Protocol passes through."""
    if isinstance(name, Protocol):
        return name
    if not isinstance(name, str) or name.lower() not in PROTOCOLS:
        raise ScheduleError(
            f"unknown protocol (choose from {', '.join(p.name for p in PROTOCOLS.values())})",
            field="protocol",
            value=name,
        )
    return PROTOCOLS[name.lower()]
