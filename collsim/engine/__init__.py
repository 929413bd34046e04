"""The discrete-event engine: replays a schedule over a fabric with max-min fair link sharing.

Entry point: :func:`simulate`. The network is seen only through the :class:`Fabric` protocol;
:class:`SimpleFabric` and the builders in :mod:`collsim.engine.fabrics` are small explicit
fabrics for tests and examples.
"""

from collsim.engine.fabric import Fabric, Link, SimpleFabric, duplex
from collsim.engine.fabrics import full_mesh_fabric, ring_fabric, star_fabric
from collsim.engine.replay import simulate
from collsim.engine.results import (
    LinkRecords,
    LinkStat,
    SimResult,
    TransferRecords,
    bottleneck_links,
)
from collsim.engine.trace import write_chrome_trace

__all__ = [
    "Fabric",
    "Link",
    "LinkRecords",
    "LinkStat",
    "SimResult",
    "SimpleFabric",
    "TransferRecords",
    "bottleneck_links",
    "duplex",
    "full_mesh_fabric",
    "ring_fabric",
    "simulate",
    "star_fabric",
    "write_chrome_trace",
]
