"""Multi-node NVLink domains (GB200/GB300 NVL72): the GPUs of consecutive nodes (trays) joined
through one level of NVLink switches, while each node keeps its NICs on the scale-out fabric.

The template's ``nvlink_domain:`` section (:class:`~collsim.topology.schema.NvlinkDomainIn`,
``docs/topology-format.md``). Nodes fill domains in order; the last one may be partial.
"""

from __future__ import annotations

from collsim.errors import TopologyError
from collsim.topology.builders import Parts
from collsim.topology.schema import NVLINK_DOMAIN_MAX_GPUS, NvlinkDomainIn


def build_nvlink_domains(
    parts: Parts, domain: NvlinkDomainIn, gpus_by_node: list[list[str]]
) -> int:
    """Join the GPUs of each run of ``domain.nodes`` consecutive nodes through one level of NVLink
    switches; returns the number of domains. Nodes fill domains in order (a 32-tray job on
    18-tray racks: 18 + 14, the last domain partial).

    The domain's switch chips are one device, ``nvl{d}.nvswitch``, and each GPU one link of all
    its ``links_per_gpu`` NVLinks: a GPU reaches every chip by one link each, and NCCL's channels
    spread over all of them, so the chips act as one non-blocking switch of the GPUs' full rate
    (as a DGX's NVSwitch chips are one ``n{node}.nvswitch``). It sits on no node: the trays'
    GPUs meet there, as nodes meet on a fabric switch, but GPUs do not forward, so no route
    between domains passes through it.
    """
    size = domain.nodes
    count = -(-len(gpus_by_node) // size)
    for d in range(count):
        sw = parts.device(
            f"nvl{d}.nvswitch",
            "nvswitch",
            latency_s=domain.switch_latency,
            in_network_reduction=domain.in_network_reduction,
            in_network_efficiency=domain.in_network_efficiency,
        )
        for node in gpus_by_node[d * size : (d + 1) * size]:
            for g in node:
                parts.link(g, sw, domain.link, count=domain.links_per_gpu)
    return count


def check_nvlink_domain(
    domain: NvlinkDomainIn, intra_kind: str, gpus: int, gpus_field: str
) -> None:
    """Refuse a domain no NVLink switch system can build: nodes that join their GPUs by their own
    means too, more GPUs than NVLink reaches, or switch chips that cannot give every GPU its
    links on every chip (one switch level). ``gpus`` per node comes from ``gpus_field``
    (``node.gpus`` or ``--gpus-per-node``)."""
    if intra_kind != "none":
        raise TopologyError(
            "the GPUs of a node in a multi-node NVLink domain meet on the domain's NVLink "
            "switches: give the node intra kind 'none'",
            field="node.intra.kind",
            value=intra_kind,
        )
    total = domain.nodes * gpus
    if total > NVLINK_DOMAIN_MAX_GPUS:
        raise TopologyError(
            f"{domain.nodes} nodes x {gpus} GPUs = {total} GPUs in one NVLink domain; NVLink "
            f"joins at most {NVLINK_DOMAIN_MAX_GPUS}",
            field="nvlink_domain.nodes" if gpus_field == "node.gpus" else gpus_field,
            value=domain.nodes if gpus_field == "node.gpus" else gpus,
        )
    chips = domain.switches
    if domain.links_per_gpu % chips:
        raise TopologyError(
            f"{domain.links_per_gpu} NVLinks per GPU cannot reach each of the {chips} switch "
            f"chips ({domain.switch_trays} trays x {domain.switches_per_tray}) equally: one "
            "switch level needs a multiple of the chips (NVL72: 18 links on 18 chips)",
            field="nvlink_domain.links_per_gpu",
            value=domain.links_per_gpu,
        )
    need = total * domain.links_per_gpu // chips
    if need > domain.ports_per_switch:
        flag = gpus_field != "node.gpus"  # the override asked for more GPUs than the file's
        raise TopologyError(
            f"{total} GPUs x {domain.links_per_gpu} NVLinks need {need} ports on each of the "
            f"{chips} switch chips ({domain.switch_trays} switch trays), which have "
            f"{domain.ports_per_switch}",
            field=gpus_field if flag else "nvlink_domain.switch_trays",
            value=gpus if flag else domain.switch_trays,
        )
