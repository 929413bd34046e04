"""Read an InfiniBand fabric as ``ibnetdiscover`` lists it, and say it as a ``fabric:`` section.

``ibnetdiscover`` prints one block per switch (``Switch <ports> "S-<guid>" # "<description>"``)
and per host channel adapter (``Ca <ports> "H-<guid>" ...``), then one line per cabled port:
``[<port>] "<S|H>-<peer guid>"[<peer port>] ... # "<peer description>" lid <n> <width><speed>``
(``4xHDR``). A switch cabled to hosts is a leaf; the others sit above, tier by tier.

Rates per lane (data, after encoding; InfiniBand Trade Association, InfiniBand Architecture
Specification Vol. 2): SDR 2, DDR 4, QDR 8, FDR10 10, FDR 13.64, EDR 25, HDR 50, NDR 100, XDR 200
Gb/s. Switch port-to-port latency, by the generation the cables run at: 130 ns at HDR/NDR (NVIDIA
Quantum QM8700 / QM9700 datasheets), 90 ns at EDR (Switch-IB 2 datasheet), 170 ns below (SX6036
datasheet: FDR/QDR).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

from collsim.errors import TopologyError
from collsim.topology.imports.inventory import read_input

LANE_GBPS = {"SDR": 2.0, "DDR": 4.0, "QDR": 8.0, "FDR10": 10.0, "FDR": 13.64, "EDR": 25.0,
             "HDR": 50.0, "NDR": 100.0, "XDR": 200.0}  # fmt: skip
_NODE = re.compile(r'^(Switch|Ca|Rt)\s+(\d+)\s+"([SHR])-([0-9a-fA-F]+)"\s*(?:#\s*"([^"]*)")?')
_PORT = re.compile(r'^\[(\d+)\](?:\([0-9a-fA-F]+\))?\s+"([SHR])-([0-9a-fA-F]+)"\[(\d+)\]')
_RATE = re.compile(r"\b(\d+)x(SDR|DDR|QDR|FDR10|FDR|EDR|HDR|NDR|XDR)\b")


@dataclass
class FabricScan:
    """What the scan found: switches (guid -> ports, description), hosts, and cables."""

    file: str
    switches: dict[str, tuple[int, str]] = field(default_factory=dict)
    hosts: dict[str, str] = field(default_factory=dict)
    ports: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    rates: Counter[str] = field(default_factory=Counter)

    def neighbours(self, guid: str) -> list[str]:
        """The devices cabled to ``guid``, once per cable (parallel cables repeat)."""
        return [peer for peer, _ in self.ports.get(guid, [])]

    def leaves(self) -> list[str]:
        return [s for s in self.switches if any(p in self.hosts for p in self.neighbours(s))]

    def tiers(self) -> int:
        """Levels of switches: leaves are 1, a switch next to tier ``t`` only is ``t + 1``."""
        level = {s: 1 for s in self.leaves()}
        frontier = list(level)
        while frontier:
            nxt = []
            for s in frontier:
                for p in self.neighbours(s):
                    if p in self.switches and p not in level:
                        level[p] = level[s] + 1
                        nxt.append(p)
            frontier = nxt
        return max(level.values(), default=0)

    def host_names(self) -> set[str]:
        """Distinct servers: a host adapter's description is ``"<hostname> <device>"``."""
        return {desc.split()[0] if desc.split() else guid for guid, desc in self.hosts.items()}


def read_ibnetdiscover(path: str | Path) -> FabricScan:
    """Parse ``ibnetdiscover`` output (see the module doc)."""
    file = str(path)
    lines = read_input(path).decode("utf-8", errors="replace").splitlines()
    scan = FabricScan(file)
    current: str | None = None
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        node = _NODE.match(text)
        if node:
            kind, ports, _, guid, desc = node.groups()
            current = guid.lower()
            if kind == "Switch":
                scan.switches[current] = (int(ports), desc or "")
            else:
                scan.hosts.setdefault(current, desc or "")
            continue
        port = _PORT.match(text)
        if port and current is not None:
            rate = _RATE.search(text)
            if rate is None:
                raise TopologyError("a cabled port without a rate like 4xHDR", file=file,
                                    field=f"line {number}", value=text[:60])  # fmt: skip
            width, speed = int(rate.group(1)), rate.group(2)
            peer = port.group(3).lower()
            if port.group(2) == "H":
                desc = re.findall(r'"([^"]*)"', text)
                scan.hosts.setdefault(peer, desc[-1] if len(desc) > 1 else "")
            if peer != current:  # a switch's loopback cables are not part of the fabric
                scan.ports.setdefault(current, []).append((peer, width * LANE_GBPS[speed]))
            scan.rates[f"{width}x{speed}"] += 1
    if not scan.switches:
        raise TopologyError("no 'Switch' block: not ibnetdiscover output", file=file,
                            field="Switch", value=None)  # fmt: skip
    return scan


def fabric_section(scan: FabricScan) -> tuple[dict[str, Any], str]:
    """The ``fabric:`` section the scan describes, and a sentence on what it found."""
    leaves = scan.leaves()
    if not leaves:
        raise TopologyError("no switch is cabled to a host adapter", file=scan.file,
                            field="Ca", value=len(scan.hosts))  # fmt: skip
    tiers = scan.tiers()
    radix = max(ports for ports, _ in scan.switches.values())
    host_rates = [r for s in scan.switches for p, r in scan.ports.get(s, []) if p in scan.hosts]
    isl = [r for s in scan.switches for p, r in scan.ports.get(s, []) if p in scan.switches]
    down = [sum(p in scan.hosts for p in scan.neighbours(s)) for s in leaves]
    up = [sum(p in scan.switches for p in scan.neighbours(s)) for s in leaves]
    fastest = max(isl or host_rates)
    latency = "0.13us" if fastest >= 200 else ("0.09us" if fastest >= 100 else "0.17us")
    fabric: dict[str, Any] = {"switch_latency": latency, "radix": radix, "routing": "dmodk"}
    note = ""
    if len(scan.switches) == 1:
        fabric["kind"] = "single_switch"
    else:
        fabric["kind"] = "fat_tree"
        fabric["tiers"] = min(3, max(2, tiers))
        if tiers == 1:
            note = "; leaves cabled to each other without a spine, taken as a 2-tier fat tree"
        ratio = median(d / u for d, u in zip(down, up, strict=True) if u) if any(up) else 1.0
        if ratio > 1:
            fabric["oversubscription"] = round(min(ratio, radix - 1), 2)
    if isl and fabric["kind"] != "single_switch":
        rate = Counter(isl).most_common(1)[0][0]
        fabric["link"] = {"kind": "infiniband", "bandwidth": f"{rate:g}Gbps", "latency": "0.6us"}
    rates = ", ".join(f"{n} {r}" for r, n in scan.rates.most_common())
    words = (
        f"ibnetdiscover scan of {Path(scan.file).name}: {len(scan.switches)} switches "
        f"({len(leaves)} leaves, {tiers} tiers, radix {radix}), {len(scan.hosts)} host adapters "
        f"on {len(scan.host_names())} hosts, leaf down:up median "
        f"{median(d / u for d, u in zip(down, up, strict=True) if u) if any(up) else 0:.2g}, "
        f"port rates {rates}; switch latency by generation (datasheets){note}"
    )
    return fabric, words
