"""What a compact topology picture draws: node 0 in full, the other nodes as boxes (one per
node, or per run of nodes when there are many; a run never crosses a multi-node NVLink domain's
edge), fabric switches as one box per tier (per dragonfly group where switch names say ``gN.``),
each multi-node NVLink domain (GB200 NVL72) as one :class:`Domain`, and every bundle of links
between two drawn units as one line with its count and bandwidth.

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
"""A fabric tier of at most this many switches shows each switch; a larger one is one box. So is
a tier of several switches that each reach most node boxes (the leaves of a rail-optimized
fabric, one per rail): drawn one by one, they are a web of lines whose labels collide."""
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
class Domain:
    """A multi-node NVLink domain as drawn: its switch's unit, the nodes (trays) whose GPUs meet
    there, and the NVLink bandwidth of each GPU into it (per direction)."""

    key: str
    index: int
    nodes: list[int]
    gpus: int
    per_gpu_bytes_per_s: float


def _span(word: str, values: list[int]) -> str:
    """``nodes 0-17``, ``node 18``."""
    if len(values) == 1:
        return f"{word} {values[0]}"
    return f"{word}s {values[0]}-{values[-1]}"


def domain_texts(domains: list[Domain]) -> list[str]:
    """What a band of one or more consecutive domains says, longest first (the drawing takes the
    first that fits the band): ``NVLink domain 0: nodes 0-17, 72 GPUs, 900 GB/s per GPU``, the
    same on two lines, then less down to ``NVLink`` over ``domain 0``."""
    rates = {d.per_gpu_bytes_per_s for d in domains}
    rate = format_rate(max(rates))
    per_gpu = f"{rate} per GPU" if len(rates) == 1 else f"up to {rate} per GPU"
    head = "NVLink " + _span("domain", [d.index for d in domains])
    nodes = _span("node", [n for d in domains for n in d.nodes])
    if len(domains) == 1:
        gpus = f"{domains[0].gpus} GPUs"
    else:  # several whole domains in one box: 8 x 72 GPUs, or their total if one is partial
        sizes = {d.gpus for d in domains}
        total = sum(d.gpus for d in domains)
        gpus = (
            f"{len(domains)} x {total // len(domains)} GPUs" if len(sizes) == 1 else f"{total} GPUs"
        )
    return [f"{head}: {nodes}, {gpus}, {per_gpu}", f"{head}: {nodes}\n{gpus}, {per_gpu}",
            f"{head}\n{nodes}", head, head.replace(" ", "\n", 1)]  # fmt: skip


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


def node_runs(nodes: int, domain_nodes: int = 1) -> list[range]:
    """Nodes 1.. in at most :data:`MAX_NODE_BOXES` contiguous runs (one node each when few).

    With multi-node NVLink domains of ``domain_nodes`` nodes, no run crosses a domain's edge, so
    that each domain's band spans whole boxes: runs of equal length within each domain, or, with
    more domains than boxes, the rest of domain 0 and then whole domains per box."""
    if nodes - 1 <= MAX_NODE_BOXES:
        return [range(n, n + 1) for n in range(1, nodes)]
    if domain_nodes <= 1:
        segments = [range(1, nodes)]
    else:
        segments = [range(max(1, s), min(s + domain_nodes, nodes))
                    for s in range(0, nodes, domain_nodes)]  # fmt: skip
    if len(segments) > MAX_NODE_BOXES:
        per = -(-(len(segments) - 1) // (MAX_NODE_BOXES - 1))
        rest = segments[1:]
        return [segments[0]] + [range(rest[i].start, rest[min(i + per, len(rest)) - 1].stop)
                                for i in range(0, len(rest), per)]  # fmt: skip
    per = -(-(nodes - 1) // MAX_NODE_BOXES)
    while sum(-(-len(seg) // per) for seg in segments) > MAX_NODE_BOXES:
        per += 1
    return [range(s, min(s + per, seg.stop)) for seg in segments
            for s in range(seg.start, seg.stop, per)]  # fmt: skip


def _unit_of_switch(dev: Device, tier_sizes: dict[int, int], boxed: set[int]) -> tuple[str, str]:
    match = _GROUP.match(dev.name)
    if match:  # a dragonfly group: its routers together
        return f"sw:{match.group(1)}", f"group {match.group(1)[1:]}"
    if tier_sizes[dev.tier] <= MAX_SWITCHES_SHOWN and dev.tier not in boxed:
        return f"dev:{dev.name}", dev.name
    return f"sw:tier{dev.tier}", f"tier {dev.tier}"


def is_domain_switch(topology: Topology, dev: Device) -> bool:
    """The NVLink switch of a multi-node domain: on no node, where the trays' GPUs meet."""
    return topology.nvlink_domain_nodes > 1 and dev.kind == "nvswitch" and dev.node is None


def group(topology: Topology) -> tuple[dict[str, Unit], list[Bundle]]:
    """The units to draw and the link bundles between them. A tier of several switches shown
    one by one becomes one box when its bundles to node boxes outnumber two per box (each
    switch reaches most boxes: a web, see :data:`MAX_SWITCHES_SHOWN`)."""
    units, bundles = _group(topology, set())
    boxes = sum(1 for u in units.values() if u.kind == "nodes")
    reach: dict[int, int] = {}
    shown: dict[int, int] = {}
    for u in units.values():
        if u.kind == "switch":
            shown[u.devices[0].tier] = shown.get(u.devices[0].tier, 0) + 1
    for b in bundles:
        ends = (units[b.a], units[b.b])
        if {u.kind for u in ends} == {"switch", "nodes"}:
            tier = next(u for u in ends if u.kind == "switch").devices[0].tier
            reach[tier] = reach.get(tier, 0) + 1
    webs = {t for t, n in reach.items() if shown[t] > 1 and n > 2 * boxes}
    return _group(topology, webs) if webs else (units, bundles)


def _group(topology: Topology, boxed: set[int]) -> tuple[dict[str, Unit], list[Bundle]]:
    """:func:`group`, with the switch tiers ``boxed`` one box whatever their size."""
    units: dict[str, Unit] = {}
    unit_of: dict[str, str] = {}
    runs = node_runs(topology.nodes, topology.nvlink_domain_nodes)
    run_of = {n: i for i, r in enumerate(runs) for n in r}
    tier_sizes: dict[int, int] = {}
    for dev in topology.devices:
        if dev.kind == "switch":
            tier_sizes[dev.tier] = tier_sizes.get(dev.tier, 0) + 1
    for dev in topology.devices:
        if is_domain_switch(topology, dev):
            key, label, kind = f"dev:{dev.name}", dev.name, "domain"
        elif dev.node is None and dev.kind != "switch":
            key, label, kind = f"dev:{dev.name}", dev.name, dev.kind
        elif dev.node is None:
            key, label = _unit_of_switch(dev, tier_sizes, boxed)
            kind = "switches" if key.startswith("sw:") else "switch"
        elif dev.node == 0 or dev.node not in run_of:
            key, label, kind = f"dev:{dev.name}", dev.name, dev.kind
        else:
            r = runs[run_of[dev.node]]
            key = f"nodes:{r.start}"
            label = f"node {r.start}" if len(r) == 1 else f"nodes {r.start}-{r[-1]}"
            kind = "nodes"
        unit = units.setdefault(key, Unit(key, label, kind, 2.0 if kind == "nodes" else 0.0))
        if kind not in ("nodes", "domain"):
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


def nvlink_domains(topology: Topology) -> list[Domain]:
    """The multi-node NVLink domains, in node order: each domain switch's GPUs, their nodes and
    their NVLink bandwidth (the sum of each GPU's links to the switch)."""
    switches = {d.name for d in topology.devices if is_domain_switch(topology, d)}
    node_of = {d.name: d.node for d in topology.devices if d.kind == "gpu"}
    per_gpu: dict[str, dict[str, float]] = {s: {} for s in switches}
    for lk in topology.links:
        for sw, gpu in ((lk.a, lk.b), (lk.b, lk.a)):
            if sw in switches and gpu in node_of:
                rates = per_gpu[sw]
                rates[gpu] = rates.get(gpu, 0.0) + lk.bandwidth_bytes_per_s
    found = []
    for sw, rates in per_gpu.items():
        if rates:
            nodes = sorted({n for g in rates if (n := node_of[g]) is not None})
            found.append((nodes, sw, len(rates), max(rates.values())))
    found.sort()
    return [Domain(f"dev:{sw}", i, nodes, gpus, rate)
            for i, (nodes, sw, gpus, rate) in enumerate(found)]  # fmt: skip


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
