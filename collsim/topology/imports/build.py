"""Write an :class:`~.inventory.Inventory` out as a topology document.

A template where the template rules say what the machine reported (one NVSwitch bandwidth for
every GPU, NICs shared by consecutive GPUs and placed where the template places them); otherwise
the template is expanded to an explicit graph and the parts it got wrong are put right (a GPU's
own NVSwitch bandwidth, a NIC's real place in the PCIe tree), so nothing reported is lost. Every
figure that is not read off the machine (latencies, the socket link, the fabric when no scan is
given) is an estimate and the document's ``source`` says so.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from collsim.topology.describe import to_explicit_dict
from collsim.topology.imports.gpus import identify, known_section
from collsim.topology.imports.inventory import (
    PATH_CLASSES,
    Inventory,
    nvlink_bytes_per_s,
    pcie_bytes_per_s,
)
from collsim.topology.loader import topology_from_dict

NVLINK_LATENCY = "0.7us"
PCIE_LATENCY = "0.5us"
NIC_LATENCY = "0.6us"
"""Estimates, the catalog's (``topologies/README.md``: NIC to NIC through one switch ~1.3 us)."""

NVLS_EFFICIENCY = {90: 0.85, 100: 0.74}
"""NCCL's ``nvlsEfficiency`` by architecture (``src/tuning/nvls.cc``), as the catalog gives it."""


def _gbs(bytes_per_s: float) -> str:
    return f"{bytes_per_s / 1e9:.6g}GB/s"


def _socket_link(inv: Inventory) -> dict[str, Any]:
    """One socket-to-socket link of the dump's CPU model (the SKU's link count is not in the
    dump, so one link, as the catalog's PCIe servers assume). Intel UPI: 10.4 GT/s (Skylake,
    Cascade Lake), 11.2 GT/s (Ice Lake), 16 GT/s (Sapphire Rapids on) x 2 bytes; AMD xGMI
    between sockets: 16 GT/s x 16 lanes / 8 = 32 GB/s (Intel Xeon Scalable and AMD EPYC
    datasheets)."""
    cpu = inv.cpus[0] if inv.cpus else None
    if cpu is not None and cpu.vendor == "GenuineIntel":
        model = cpu.model or 0
        gts = 16.0 if model >= 0x8F else (11.2 if model >= 0x6A else 10.4)
        return {"kind": "upi", "bandwidth": _gbs(gts * 2e9), "latency": "0.3us"}
    return {"kind": "xgmi" if cpu and cpu.vendor == "AuthenticAMD" else "upi",
            "bandwidth": "32GB/s", "latency": "0.3us"}  # fmt: skip


def _pcie_rate(inv: Inventory) -> float:
    """The GPUs' PCIe link (the slowest reported; NCCL's fallback, Gen3, where none is)."""
    rates = [pcie_bytes_per_s(g.pcie_gts, g.pcie_width) for g in inv.gpus if g.pcie_gts]
    if not rates:
        inv.notes.append("no PCIe speed reported: Gen3 x16 assumed, as NCCL does")
        return pcie_bytes_per_s(8.0, 16)
    return min(rates)


def _homes(inv: Inventory) -> list[str]:
    """Per GPU, the PCIe device it hangs off: its nearest switch, or its socket's root port."""
    return [g.bridges[0] if g.bridges else f"cpu{g.numa}:{g.busid}" for g in inv.gpus]


def _intra(inv: Inventory, p2p: bool, sm: int) -> dict[str, Any]:
    per_link = nvlink_bytes_per_s(sm)
    if inv.nvswitch_links:
        links = Counter(inv.nvswitch_links).most_common(1)[0][0]
        intra: dict[str, Any] = {
            "kind": "nvswitch",
            "link": {"kind": "nvlink", "bandwidth": _gbs(links * per_link),
                     "latency": NVLINK_LATENCY},
            "switch_latency": "0.1us",
        }  # fmt: skip
        if sm >= 90:  # NVLink SHARP from third-generation NVSwitch (Hopper) on
            intra["in_network_reduction"] = True
            intra["in_network_efficiency"] = NVLS_EFFICIENCY[100 if sm >= 100 else 90]
        return intra
    if inv.nvlink_pairs:
        return {
            "kind": "mesh",
            "link": {"kind": "nvlink", "bandwidth": _gbs(per_link), "latency": NVLINK_LATENCY},
            "pairs": [[a, b, n] for (a, b), n in sorted(inv.nvlink_pairs.items())],
        }
    numas = sorted({g.numa for g in inv.gpus})
    intra = {
        "kind": "pcie",
        "p2p": p2p,
        "link": {"kind": "pcie", "bandwidth": _gbs(_pcie_rate(inv)), "latency": PCIE_LATENCY},
        "pcie_switches": len(set(_homes(inv))),
        "sockets": len(numas),
    }
    if not p2p:
        intra["host_latency"] = "3us"  # the catalog's estimate for host-staged copies
    if len(numas) > 1:
        intra["cpu_link"] = _socket_link(inv)
    return intra


def _nics(inv: Inventory) -> dict[str, Any] | None:
    """The ``nics:`` section (``None``: no NICs); ports slower than the fastest are dropped
    from ``inv`` (and said in its notes)."""
    if not inv.nics:
        return None
    fastest = max(n.speed_gbps or 0 for n in inv.nics)
    slow = [n.name for n in inv.nics if (n.speed_gbps or 0) < fastest]
    if slow:
        inv.notes.append(f"slower ports left out ({', '.join(slow)}): NCCL uses the fastest")
        keep = [n for n in inv.nics if (n.speed_gbps or 0) == fastest]
        kept = {id(n) for n in keep}
        old = [j for j, n in enumerate(inv.nics) if id(n) in kept]
        inv.affinity = {(i, old.index(j)): c for (i, j), c in inv.affinity.items() if j in old}
        inv.nics = keep
    kinds = Counter(n.kind for n in inv.nics).most_common(1)[0][0]
    paths = [inv.path(i, inv.nearest_nics(i)[0]) for i in range(len(inv.gpus))]
    worst = max(paths, key=PATH_CLASSES.index)
    nics: dict[str, Any] = {
        "count": len(inv.nics),
        "link": {"kind": kinds, "bandwidth": f"{fastest:g}Gbps", "latency": NIC_LATENCY},
    }
    if worst != "pix":
        nics["gpu_path"] = worst
    return nics


def _order_nics(inv: Inventory) -> None:
    """NICs in the order of the GPUs nearest them (so NIC ``j`` serves the ``j``-th group of
    consecutive GPUs, as the template shares them); ``source:`` keeps the dump's names."""
    first: dict[int, int] = {}
    for i in range(len(inv.gpus)):
        for j in inv.nearest_nics(i):
            first.setdefault(j, i)
    order = sorted(range(len(inv.nics)), key=lambda j: (first.get(j, len(inv.gpus)), j))
    inv.affinity = {(i, order.index(j)): c for (i, j), c in inv.affinity.items()}
    inv.nics = [inv.nics[j] for j in order]


def _fabric(inv: Inventory, nodes: int) -> dict[str, Any]:
    """A default fabric (estimates, as the source says) when no scan describes one."""
    ib = bool(inv.nics) and inv.nics[0].kind == "infiniband"
    one_per_gpu = len(inv.nics) == len(inv.gpus) > 1
    fabric: dict[str, Any] = {
        "kind": "rail_optimized" if one_per_gpu and nodes * len(inv.nics) > 64 else "fat_tree",
        "radix": 64,
        "switch_latency": "0.13us" if ib else "0.3us",
    }
    if nodes * len(inv.nics) <= 64:
        fabric["kind"] = "single_switch"
    elif nodes * len(inv.nics) > 64 * 32:  # beyond two tiers of radix-64 switches
        fabric["tiers"] = 3
    return fabric


def build_document(
    inv: Inventory,
    *,
    name: str,
    nodes: int = 1,
    gpu: dict[str, Any] | None = None,
    p2p: bool | None = None,
    fabric: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The topology document for ``nodes`` servers like ``inv`` (see the module doc). ``gpu``:
    a ``gpu:`` section to use instead of the one the PCI device id names; ``p2p``: whether
    GPUs reach each other over PCIe (default: as the GPU's driver allows); ``fabric``: the
    ``fabric:`` section (a scan's, :mod:`.ibnet`), else a default one."""
    first = inv.gpus[0]
    known = identify(first.device_id, first.busid, inv.sources[0]) if gpu is None else None
    section = known_section(known) if known is not None else dict(gpu or {})
    if len({g.device_id for g in inv.gpus}) > 1:
        inv.notes.append("GPUs of several models: all taken as GPU 0's")
    allow_p2p = p2p if p2p is not None else (known.p2p if known is not None else True)
    sm = first.sm or 80
    _order_nics(inv)
    intra = _intra(inv, allow_p2p, sm)
    node: dict[str, Any] = {"gpus": len(inv.gpus), "intra": intra}
    nics = _nics(inv)
    if nics is not None:
        # In a PCIe node this class is also the switches' uplinks: the GPUs' rate. Elsewhere it
        # joins a GPU and its NIC: the slower of the two.
        nic_rates = [pcie_bytes_per_s(n.pcie_gts, n.pcie_width) for n in inv.nics if n.pcie_gts]
        rate = _pcie_rate(inv) if intra["kind"] == "pcie" else min([_pcie_rate(inv), *nic_rates])
        node["pcie"] = {"kind": "pcie", "bandwidth": _gbs(rate), "latency": PCIE_LATENCY}
        node["nics"] = nics
    doc: dict[str, Any] = {
        "name": name,
        "description": _description(inv, section, intra, nics),
        "source": "collsim topo import",
        "nodes": nodes,
        "gpu": section,
        "node": node,
    }
    if nics is not None:
        doc["fabric"] = fabric if fabric is not None else _fabric(inv, nodes)
    explicit = _needs_explicit(inv, intra)
    if explicit:
        doc = _explicit(doc, inv, nodes, explicit)
    doc["source"] = _source(inv, fabric is None and nics is not None, explicit)
    return doc


def _description(
    inv: Inventory, gpu: dict[str, Any], intra: dict[str, Any], nics: dict[str, Any] | None
) -> str:
    what = {"nvswitch": f"NVSwitch at {intra['link']['bandwidth']} per GPU",
            "mesh": "direct NVLinks", "pcie": "PCIe"}[intra["kind"]]  # fmt: skip
    net = f", {nics['count']}x {nics['link']['bandwidth']} {nics['link']['kind']}" if nics else ""
    return f"{len(inv.gpus)}x {gpu.get('model', 'GPU')} per server, {what}{net}, as reported."


def _source(inv: Inventory, default_fabric: bool, explicit: list[str]) -> str:
    parts = [f"collsim topo import of {', '.join(Path(s).name for s in inv.sources)}"]
    if inv.nics:
        names = ", ".join(f"nic{j}={n.name}" for j, n in enumerate(inv.nics))
        parts.append(f"NICs in GPU order: {names}")
    if explicit:
        parts.append("explicit graph: " + "; ".join(explicit))
    parts.extend(dict.fromkeys(inv.notes))  # each once, in order
    parts.append("latencies are the catalog's estimates")
    if default_fabric:
        parts.append("fabric not scanned: a default one (estimate); give an ibnetdiscover dump")
    return "; ".join(parts)


def _needs_explicit(inv: Inventory, intra: dict[str, Any]) -> list[str]:
    """What the template cannot say about this server (empty: the template is exact)."""
    why = []
    if inv.nvswitch_links and len(set(inv.nvswitch_links)) > 1:
        why.append("GPUs have different NVSwitch link counts " + str(inv.nvswitch_links))
    g, c = len(inv.gpus), len(inv.nics)
    if c:
        groups = min(g, c)
        for i in range(g):
            k = i * groups // g
            mine = set(range(k * c // groups, (k + 1) * c // groups))
            if not set(inv.nearest_nics(i)) & mine:
                why.append(f"GPU {i}'s nearest NIC is not the one the template gives it")
                break
        if intra["kind"] == "pcie":
            homes = _homes(inv)
            for k in range(groups):
                gpu, nic = k * g // groups, k * c // groups
                parent = inv.nics[nic].bridges[:1]
                if parent and parent[0] != homes[gpu]:
                    why.append(f"NIC {nic} sits away from GPU {gpu}, where the template puts it")
                    break
    return why


def _explicit(doc: dict[str, Any], inv: Inventory, nodes: int, why: list[str]) -> dict[str, Any]:
    """The template expanded, with each GPU's own NVSwitch bandwidth and each NIC moved to its
    real place (the switch of the GPUs it shares one with, else its socket)."""
    topo = topology_from_dict(doc, nodes=nodes)
    out = to_explicit_dict(topo)
    out["source"] = doc["source"]
    per_link = nvlink_bytes_per_s(inv.gpus[0].sm or 80)
    kinds = {d["name"]: d["kind"] for d in out["devices"]}
    links = []
    moved: dict[str, str] = {}
    sockets = sorted({g.numa for g in inv.gpus})
    homes = _template_homes(out, kinds)
    for n in range(nodes):
        for j, nic in enumerate(inv.nics):
            near = [i for i in range(len(inv.gpus)) if inv.path(i, j) == "pix"]
            if near:
                home = homes.get(f"n{n}.gpu{near[0]}")
            elif nic.numa in sockets and f"n{n}.cpu{sockets.index(nic.numa)}" in kinds:
                home = f"n{n}.cpu{sockets.index(nic.numa)}"
            else:
                home = None
            if home is not None:
                moved[f"n{n}.nic{j}"] = home
    for link in out["links"]:
        a, b = link["a"], link["b"]
        for nic_end, other in ((a, b), (b, a)):
            if nic_end in moved and kinds.get(other) != "switch":
                link = {**link, "a": nic_end, "b": moved[nic_end]}
        if inv.nvswitch_links and kinds.get(b) == "nvswitch" and kinds.get(a) == "gpu":
            i = int(a.split(".gpu")[1])
            link = {**link, "bandwidth": _gbs(inv.nvswitch_links[i] * per_link)}
        links.append(link)
    out["links"] = _dedupe(links)
    return out


def _template_homes(out: dict[str, Any], kinds: dict[str, str]) -> dict[str, str]:
    """Per GPU, the PCIe switch (or CPU) the expanded template hangs it off (one pass)."""
    homes: dict[str, str] = {}
    for link in out["links"]:
        for end, other in ((link["a"], link["b"]), (link["b"], link["a"])):
            if kinds.get(end) == "gpu" and kinds.get(other) in ("pcie_switch", "cpu"):
                homes.setdefault(end, other)
    return homes


def _dedupe(links: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One link per device pair (a moved NIC may land where the template already linked it)."""
    seen: set[frozenset[str]] = set()
    out = []
    for link in links:
        key = frozenset((link["a"], link["b"]))
        if key in seen or link["a"] == link["b"]:
            continue
        seen.add(key)
        out.append(link)
    return out
