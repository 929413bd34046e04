"""What a compact topology picture draws: node 0 in full, the other nodes as boxes (one per
node, or per run of nodes when there are many), fabric switches as one box per tier (per
dragonfly group where switch names say ``gN.``), and every bundle of links between two drawn
units as one line with its count and bandwidth.

A 16-node DGX H100 cluster has 640 links; drawn one by one they are a blue mass. Grouped, the
picture shows one server's insides, how many servers there are, and the fabric's shape (tiers,
how many links join them and at what rate). Pure data, no matplotlib: the drawing is
:mod:`collsim.report.topology_plot`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from collsim.topology.spec import Device, Topology
from collsim.units import format_rate

MAX_NODE_BOXES = 7
"""Boxes for the nodes other than node 0, at most (more nodes share boxes)."""
MAX_SWITCHES_SHOWN = 4
"""A fabric tier of at most this many switches shows each switch; a larger one is one box."""
_GROUP = re.compile(r"^(g\d+)\.")


@dataclass
class Unit:
    """One drawn thing: a device of node 0 (or a small tier's switch), or a box of many."""

    key: str
    label: str
    kind: str
    """The device kind, or ``nodes``/``switches`` for a box."""
    layer: float
    devices: list[Device] = field(default_factory=list)
    inner_links: dict[str, int] = field(default_factory=dict)
    """Links inside a box, by kind (e.g. NVLink inside a server, dragonfly links in a group)."""

    @property
    def is_box(self) -> bool:
        return self.kind in ("nodes", "switches")


@dataclass
class Bundle:
    """The links of one kind between two units."""

    a: str
    b: str
    kind: str
    count: int = 0
    bandwidths: set[float] = field(default_factory=set)

    def label(self) -> str:
        """``8 x 50 GB/s`` (per-direction rate of each link)."""
        if len(self.bandwidths) == 1:
            return f"{self.count} x {format_rate(next(iter(self.bandwidths)))}"
        return f"{self.count} links"


def layer_of(dev: Device) -> float:
    """y of a device: GPUs at the bottom, then switches inside a node, CPUs, NICs, fabric tiers."""
    if dev.kind == "switch":
        return 2.5 + max(1, dev.tier)
    return {"gpu": 0.0, "nvswitch": 1.0, "pcie_switch": 1.0, "cpu": 1.5, "nic": 2.0}[dev.kind]


def node_runs(nodes: int) -> list[range]:
    """Nodes 1.. in at most :data:`MAX_NODE_BOXES` contiguous runs (one node each when few)."""
    rest = list(range(1, nodes))
    if len(rest) <= MAX_NODE_BOXES:
        return [range(n, n + 1) for n in rest]
    per = -(-len(rest) // MAX_NODE_BOXES)
    return [range(s, min(s + per, nodes)) for s in range(1, nodes, per)]


def _unit_of_switch(dev: Device, tier_sizes: dict[int, int]) -> tuple[str, str]:
    match = _GROUP.match(dev.name)
    if match:  # a dragonfly group: its routers together
        return f"sw:{match.group(1)}", f"group {match.group(1)[1:]}"
    if tier_sizes[dev.tier] <= MAX_SWITCHES_SHOWN:
        return f"dev:{dev.name}", dev.name
    return f"sw:tier{dev.tier}", f"tier {dev.tier}"


def group(topology: Topology) -> tuple[dict[str, Unit], list[Bundle]]:
    """The units to draw and the link bundles between them."""
    units: dict[str, Unit] = {}
    unit_of: dict[str, str] = {}
    runs = node_runs(topology.nodes)
    run_of = {n: i for i, r in enumerate(runs) for n in r}
    tier_sizes: dict[int, int] = {}
    for dev in topology.devices:
        if dev.kind == "switch":
            tier_sizes[dev.tier] = tier_sizes.get(dev.tier, 0) + 1
    for dev in topology.devices:
        if dev.node is None and dev.kind != "switch":
            key, label, kind = f"dev:{dev.name}", dev.name, dev.kind
        elif dev.node is None:
            key, label = _unit_of_switch(dev, tier_sizes)
            kind = "switches" if key.startswith("sw:") else "switch"
        elif dev.node == 0 or dev.node not in run_of:
            key, label, kind = f"dev:{dev.name}", dev.name, dev.kind
        else:
            r = runs[run_of[dev.node]]
            key = f"nodes:{r.start}"
            label = f"node {r.start}" if len(r) == 1 else f"nodes {r.start}-{r[-1]}"
            kind = "nodes"
        unit = units.setdefault(key, Unit(key, label, kind, 2.0 if kind == "nodes" else 0.0))
        if kind != "nodes":
            unit.layer = layer_of(dev)
        unit.devices.append(dev)
        unit_of[dev.name] = key
    bundles: dict[tuple[str, str, str], Bundle] = {}
    for lk in topology.links:
        ua, ub = unit_of[lk.a], unit_of[lk.b]
        if ua == ub:
            inner = units[ua].inner_links
            inner[lk.kind] = inner.get(lk.kind, 0) + 1
            continue
        a, b = sorted((ua, ub))
        bundle = bundles.setdefault((a, b, lk.kind), Bundle(a, b, lk.kind))
        bundle.count += 1
        bundle.bandwidths.add(lk.bandwidth_bytes_per_s)
    return units, list(bundles.values())


def box_text(unit: Unit) -> str:
    """What a box says: what it holds, and the links inside it."""
    kinds: dict[str, int] = {}
    for dev in unit.devices:
        kinds[dev.kind] = kinds.get(dev.kind, 0) + 1
    if unit.kind == "nodes":
        nodes = len({d.node for d in unit.devices})
        head = f"{unit.label}" + (f"\n({nodes} nodes)" if nodes > 1 else "")
        names = {"gpu": "GPUs", "nic": "NICs"}
        held = ", ".join(f"{kinds[k]} {names[k]}" for k in names if k in kinds)
        return f"{head}\n{held}"
    n = len(unit.devices)
    lines = [f"{unit.label}: {n} switch{'es' if n > 1 else ''}"]
    lines += [f"{count} {kind} links inside" for kind, count in unit.inner_links.items()]
    return "\n".join(lines)
