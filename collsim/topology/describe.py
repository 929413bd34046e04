"""What users read about a topology: catalog rows, a description, and the explicit-graph export."""

from __future__ import annotations

import textwrap
from typing import Any

import yaml

from collsim import units
from collsim.topology.graph import Network, count_by_kind
from collsim.topology.loader import catalog_names, load_topology
from collsim.topology.routing import BALANCED_KINDS
from collsim.topology.spec import INTRA_NODE_LINK_KINDS, Topology
from collsim.transports import transport_for


def catalog_rows() -> list[dict[str, Any]]:
    """One row per bundled system, for ``collsim topo list``."""
    rows = []
    for name in catalog_names():
        topo = load_topology(name)
        rows.append(
            {
                "name": name,
                "gpu": topo.gpu.model,
                "gpus_per_node": topo.gpus_per_node,
                "default_nodes": topo.default_nodes,
                "intra": topo.intra_fabric,
                "inter": topo.inter_fabric,
                "description": topo.description,
            }
        )
    return rows


def describe(topo: Topology) -> dict[str, Any]:
    """The figures that size a system: counts, bandwidths (GB/s = 1e9 B/s), diameter."""
    net = Network(topo)
    links: dict[str, dict[str, Any]] = {}
    for lk in topo.links:
        entry = links.setdefault(lk.kind, {"count": 0, "bandwidth_gbps": set()})
        entry["count"] += 1
        entry["bandwidth_gbps"].add(round(units.to_gbps(lk.bandwidth_bytes_per_s), 3))
        if lk.duplex_bandwidth_bytes_per_s is not None:  # both ways share this much
            entry.setdefault("duplex_gbps", set()).add(
                round(units.to_gbps(lk.duplex_bandwidth_bytes_per_s), 3)
            )
    for entry in links.values():
        for key in ("bandwidth_gbps", "duplex_gbps"):
            if key in entry:
                entry[key] = sorted(entry[key])
    reducing = sorted({d.kind for d in topo.devices if d.in_network_reduction})
    # node 0's GPUs only (what is shown): every GPU's took 16 of 20 s on 1024 DGX nodes
    affinity = {g.name: net.nics_of(g.name) for g in topo.gpus if g.name.startswith("n0.")}
    return {
        "name": topo.name,
        "description": topo.description,
        "file": topo.source_file,
        "gpu": {
            "model": topo.gpu.model,
            "peak_tflops": {k: v / 1e12 for k, v in topo.gpu.peak_flops.items()},
            "matmul_tflops": {k: topo.gpu.matmul_rate(k) / 1e12 for k in topo.gpu.peak_flops},
            "matmul_measured": sorted(topo.gpu.matmul_flops),
            "memory_gb": topo.gpu.memory_bytes / 1e9,
            "memory_bandwidth_gbps": units.to_gbps(topo.gpu.memory_bandwidth_bytes_per_s),
        },
        "nodes": topo.nodes,
        "gpus_per_node": topo.gpus_per_node,
        "gpus": topo.n_gpus,
        "intra_fabric": topo.intra_fabric,
        "inter_fabric": topo.inter_fabric,
        "routing": routing_words(topo),
        **({"nvlink_domain": _domain(topo, net)} if topo.nvlink_domain_nodes > 1 else {}),
        "devices": count_by_kind(topo.devices),
        "links": links,
        **(
            {
                "shared": [
                    {
                        "name": sh.name,
                        "bandwidth_gbps": units.to_gbps(sh.bandwidth_bytes_per_s),
                        "links": len(sh.directions),
                    }
                    for sh in topo.shared
                ]
            }
            if topo.shared
            else {}
        ),
        "injection_bandwidth_gbps_per_gpu": units.to_gbps(net.injection_bandwidth_bytes_per_s()),
        "intra_bandwidth_gbps_per_gpu": units.to_gbps(net.intra_bandwidth_bytes_per_s()),
        "bisection_bandwidth_gbps": units.to_gbps(net.bisection_bandwidth_bytes_per_s()),
        "diameter_hops": net.diameter_hops(),
        "in_network_reduction": reducing,
        **({"transports": _transports(topo)} if _transports(topo) else {}),
        "gpu_nic_affinity": affinity,
        **({"faults": list(topo.faults)} if topo.faults else {}),
    }


ROUTING_WORDS = {
    "ecmp": "ecmp (each flow hashed onto one equal-cost path)",
    "dmodk": "dmodk (forwarded by destination, spread evenly over the up-links)",
    "spray": "spray (each flow split evenly over the equal-cost paths)",
    "adaptive": "adaptive (each flow over minimal and non-minimal paths, UGAL-style)",
}
"""What ``topo show`` says of each routing (``docs/topology-format.md``)."""


def routing_words(topo: Topology) -> str:
    """The scale-out fabric's routing as ``topo show`` prints it; where the file gives none,
    the rule by link kind it falls back to."""
    if topo.routing is not None:
        return ROUTING_WORDS[topo.routing]
    kinds = sorted({lk.kind for lk in topo.links if lk.kind not in INTRA_NODE_LINK_KINDS})
    if not kinds:
        return "none (no scale-out links)"
    by_kind = ", ".join(f"{k} {'dmodk' if k in BALANCED_KINDS else 'ecmp'}" for k in kinds)
    return f"not given: by link kind ({by_kind})"


def _transports(topo: Topology) -> list[dict[str, Any]]:
    """The net transport of each kind of NIC cable (collsim/transports.py): its per-step
    overhead (LL/LL128, Simple), the fraction of the line rate it attains, the fraction one
    connection attains on its own and, where set, its proxy's time per point-to-point message."""
    nics = {d.name for d in topo.devices if d.kind == "nic"}
    kinds = sorted({lk.kind for lk in topo.links if lk.a in nics or lk.b in nics})
    out = []
    for kind in kinds:
        transport = transport_for(kind, topo.transport)
        if transport is not None:
            ll, _, simple = transport.step_overhead_s
            out.append({
                "link_kind": kind,
                "transport": transport.name,
                "step_overhead_us": {"LL": units.to_us(ll), "Simple": units.to_us(simple)},
                "bandwidth_fraction": transport.bandwidth_fraction,
                "connection_fraction": transport.connection_fraction,
                "gpu_path": topo.nic_gpu_path,
                **({"proxy_message_us": transport.proxy_message_us}
                   if transport.proxy_message_us > 0 else {}),
            })  # fmt: skip
    return out


def _domain(topo: Topology, net: Network) -> dict[str, Any]:
    """A multi-node NVLink domain: its size, how the nodes fill the domains (in order, the last
    one possibly partial) and the NVLink bandwidth of a GPU."""
    size = topo.nvlink_domain_nodes
    fill = [min(size, topo.nodes - d * size) for d in range(topo.nvlink_domains)]
    return {
        "nodes": size,
        "gpus": size * topo.gpus_per_node,
        "domains": topo.nvlink_domains,
        "nodes_per_domain": fill,
        "switches": [d.name for d in topo.devices if d.kind == "nvswitch" and d.node is None],
        "nvlink_bandwidth_gbps_per_gpu": units.to_gbps(net.intra_bandwidth_bytes_per_s()),
    }


def _matmul_words(gpu: dict[str, Any]) -> str:
    """The GPU's best matmul rates for its first dtypes, measured or assumed."""
    words = []
    for key, rate in list(gpu["matmul_tflops"].items())[:3]:
        how = "measured" if key in gpu["matmul_measured"] else "assumed"
        words.append(f"{rate:.4g} {key} ({how}, {rate / gpu['peak_tflops'][key]:.0%} of peak)")
    return ", ".join(words) + " TFLOP/s"


def describe_text(info: dict[str, Any]) -> str:
    """``describe`` as lines a person reads."""
    gpu = info["gpu"]
    peak = gpu["peak_tflops"]
    peak_words = ", ".join(f"{v:g} {k}" for k, v in list(peak.items())[:3])
    lines = [
        textwrap.fill(f"{info['name']}: {info['description']}", width=100),
        f"  file:        {info['file']}",
        f"  GPUs:        {info['gpus']} x {gpu['model']} ({info['nodes']} nodes x "
        f"{info['gpus_per_node']})",
        f"  per GPU:     {peak_words} TFLOP/s; {gpu['memory_gb']:g} GB at "
        f"{gpu['memory_bandwidth_gbps']:g} GB/s",
        f"  best matmul: {_matmul_words(gpu)}",
        f"  fabric:      intra-node {info['intra_fabric']}; scale-out {info['inter_fabric']}",
        f"  routing:     {info['routing']}",
        *(
            f"  NVLink domain: {dom['nodes']} nodes x {info['gpus_per_node']} = {dom['gpus']} "
            f"GPUs; this system fills {dom['domains']} "
            f"({' + '.join(map(str, dom['nodes_per_domain']))} nodes); "
            f"{dom['nvlink_bandwidth_gbps_per_gpu']:g} GB/s NVLink per GPU"
            for dom in ([info["nvlink_domain"]] if "nvlink_domain" in info else [])
        ),
        "  devices:     " + ", ".join(f"{k} {v}" for k, v in info["devices"].items()),
        "  links:       "
        + ", ".join(
            f"{k} {v['count']} ({'/'.join(f'{b:g}' for b in v['bandwidth_gbps'])} GB/s"
            + (
                f"; both ways {'/'.join(f'{b:g}' for b in v['duplex_gbps'])} GB/s"
                if "duplex_gbps" in v
                else ""
            )
            + ")"
            for k, v in info["links"].items()
        ),
        *(
            f"  shared:      {sh['name']}: {sh['bandwidth_gbps']:g} GB/s for {sh['links']} links"
            for sh in info.get("shared", [])
        ),
        f"  bandwidth:   intra-node {info['intra_bandwidth_gbps_per_gpu']:.4g} GB/s per GPU; "
        f"injection {info['injection_bandwidth_gbps_per_gpu']:.4g} GB/s per GPU; "
        f"bisection {info['bisection_bandwidth_gbps']:.6g} GB/s",
        f"  diameter:    {info['diameter_hops']} hops (GPU to GPU)",
        "  in-network reduction: " + (", ".join(info["in_network_reduction"]) or "none"),
        *(
            f"  transport:   {t['link_kind']} NICs via {t['transport']}: "
            f"+{t['step_overhead_us']['LL']:g} us per network step "
            f"(Simple +{t['step_overhead_us']['Simple']:g} us), "
            f"{t['bandwidth_fraction']:g} of line rate"
            + (
                f", one connection {t['connection_fraction']:g} of it"
                if t.get("connection_fraction", 1.0) < 1.0
                else ""
            )
            + f"; GPU to NIC {t['gpu_path'].upper()}"
            + ("" if t["gpu_path"] in ("pix", "pxb") else " (no LL128 across nodes)")
            + (
                f"; point to point {t['proxy_message_us']:g} us per 128 KiB message on each "
                "GPU's proxy"
                if "proxy_message_us" in t
                else ""
            )
            for t in info.get("transports", [])
        ),
    ]
    if info.get("faults"):
        lines.append("  faults:      " + "; ".join(info["faults"]))
    nics = info["gpu_nic_affinity"]
    if any(nics.values()):
        lines.append(
            "  NIC affinity (node 0): "
            + "; ".join(f"{g.split('.')[1]}->{','.join(n.split('.')[1] for n in v)}"
                        for g, v in nics.items())
        )  # fmt: skip
    return "\n".join(lines)


def to_explicit_yaml(topo: Topology) -> str:
    """The topology as an explicit-graph YAML file that loads to the same devices and links."""
    return yaml.safe_dump(to_explicit_dict(topo), sort_keys=False, width=120)


def to_explicit_dict(topo: Topology) -> dict[str, Any]:
    """The topology as an explicit-graph document (what :func:`to_explicit_yaml` writes)."""
    gpu = topo.gpu
    doc: dict[str, Any] = {
        "name": topo.name,
        "description": topo.description,
        "gpu": {
            "model": gpu.model,
            "peak_tflops": {k: v / 1e12 for k, v in gpu.peak_flops.items()},
            **(
                {"matmul_tflops": {k: v / 1e12 for k, v in gpu.matmul_flops.items()}}
                if gpu.matmul_flops
                else {}
            ),
            **({"sms": gpu.sms} if gpu.sms is not None else {}),
            "memory": f"{gpu.memory_bytes}B",
            "memory_bandwidth": f"{gpu.memory_bandwidth_bytes_per_s!r}B/s",
            **({"source": gpu.source} if gpu.source else {}),
        },
        "devices": [
            {
                "name": d.name,
                "kind": d.kind,
                **({"node": d.node} if d.node is not None else {}),
                "index": d.index,
                **({"latency": f"{d.latency_s!r}s"} if d.latency_s else {}),
                **({"in_network_reduction": True} if d.in_network_reduction else {}),
                **(
                    {"in_network_efficiency": d.in_network_efficiency}
                    if d.in_network_efficiency != 1.0
                    else {}
                ),
                **({"tier": d.tier} if d.tier else {}),
                **({"forwards": d.forwards} if d.forwards != (d.kind != "gpu") else {}),
            }
            for d in topo.devices
        ],
        "links": [
            {
                "a": lk.a,
                "b": lk.b,
                "kind": lk.kind,
                "bandwidth": f"{lk.bandwidth_bytes_per_s!r}B/s",
                "latency": f"{lk.latency_s!r}s",
                **(
                    {"duplex_bandwidth": f"{lk.duplex_bandwidth_bytes_per_s!r}B/s"}
                    if lk.duplex_bandwidth_bytes_per_s is not None
                    else {}
                ),
            }
            for lk in topo.links
        ],
    }
    if topo.routing is not None:
        doc["routing"] = topo.routing
    if not topo.gpu_p2p:
        doc["gpu_p2p"] = False
    if topo.shared:
        doc["shared"] = [
            {
                "name": sh.name,
                "kind": sh.kind,
                "bandwidth": f"{sh.bandwidth_bytes_per_s!r}B/s",
                "directions": [list(d) for d in sh.directions],
            }
            for sh in topo.shared
        ]
    return doc
