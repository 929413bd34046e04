"""A CPU between a GPU and a NIC (NCCL's PATH_PHB): where a template's NICs hang off the CPU's
root ports (``node.nics.gpu_path: phb``), and the capacity its root complex forwards
peer-to-peer traffic with, both directions together (``node.intra.host_p2p_bandwidth``).

GPUDirect RDMA between a GPU and a NIC on different root ports crosses the root complex: the NIC
reads the GPU's memory for sends and writes it for receives, and both go through the CPU's
forwarding. NCCL uses GPUDirect RDMA over such a path only when told to (``ncclTopoCheckGdr``,
``src/graph/paths.cc``: the default level is ``PATH_PXB``), because CPUs forward peer-to-peer
traffic poorly (S. Jeaugey, NVIDIA/nccl#465); the GDR pair of ``data/nccl-tests`` measures it:
24 GB/s one way, 13.5-14.7 GB/s a direction both ways at once.
"""

from __future__ import annotations

from collections.abc import Sequence

from collsim.errors import TopologyError
from collsim.topology.schema import IntraIn
from collsim.topology.spec import Device, Link, SharedCapacity

ROOT_PORT_KINDS = frozenset({"gpu", "nic", "pcie_switch"})
"""Devices that meet a CPU on one of its PCIe root ports (a socket link is not one)."""

FIELD = "node.intra.host_p2p_bandwidth"


def cpu_above(devices: Sequence[Device], links: Sequence[Link], home: str) -> str | None:
    """The CPU a PCIe home (a switch, a GPU, or a CPU itself) hangs off; None if none yet."""
    kinds = {d.name: d.kind for d in devices}
    if kinds[home] == "cpu":
        return home
    for lk in links:
        if home in (lk.a, lk.b):
            other = lk.b if lk.a == home else lk.a
            if kinds[other] == "cpu":
                return other
    return None


def forwarding_capacities(
    devices: Sequence[Device], links: Sequence[Link], n: int, intra: IntraIn
) -> list[SharedCapacity]:
    """One shared capacity per CPU of node ``n``, ``n{n}.cpu{s} peer-to-peer forwarding``, of
    ``intra.host_p2p_bandwidth``, over the directions into the CPU from its root ports. A byte
    forwarded from one root port to another (or to the other socket) enters the CPU once, from
    a root port, so GPUDirect RDMA sends (GPU to NIC) and receives (NIC to GPU) through one CPU
    load it alike, once each. Nothing without the field; an error where it cannot apply."""
    rate = intra.host_p2p_bandwidth
    if rate is None:
        return []
    shown = f"{rate / 1e9:g}GB/s"
    if intra.kind == "pcie" and not intra.p2p:
        raise TopologyError(
            "p2p: false stages GPU traffic in host memory, so no CPU forwards it peer-to-peer",
            field=FIELD,
            value=shown,
        )
    kinds = {d.name: d.kind for d in devices}
    cpus = [d.name for d in devices if d.kind == "cpu" and d.node == n]
    if not cpus:
        raise TopologyError(
            "this node builds no CPU (its NICs join the GPUs directly or on their PCIe switch, "
            "and it has no PCIe tree): give node.nics.gpu_path: phb where GPU-NIC traffic "
            "crosses the CPU, or leave the field out",
            field=FIELD,
            value=shown,
        )
    shared = []
    for cpu in cpus:
        into = [
            (other, cpu)
            for lk in links
            if cpu in (lk.a, lk.b)
            for other in [lk.b if lk.a == cpu else lk.a]
            if kinds[other] in ROOT_PORT_KINDS
        ]
        if into:
            shared.append(
                SharedCapacity(f"{cpu} peer-to-peer forwarding", "pcie", rate, tuple(into))
            )
    return shared
