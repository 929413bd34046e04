"""Read the system NCCL detected: the XML it writes with ``NCCL_TOPO_DUMP_FILE``.

The format (NCCL ``src/graph/xml.cc``, read back with ``NCCL_TOPO_FILE``): a ``<system>`` of
``<cpu numaid=...>`` sockets; below each a tree of ``<pci busid class link_speed link_width>``
bridges and endpoints; a GPU endpoint holds ``<gpu dev sm rank>`` with ``<nvlink target count
tclass>`` children (``tclass`` 0x068000: an NVSwitch; 0x03xxxx: another GPU), a NIC endpoint
``<nic>`` with one ``<net name speed port ...>`` per port (``speed`` in Mb/s). A ``<nic>`` may
also sit directly under a ``<cpu>`` (a NIC NCCL could not place in the PCIe tree, or a kernel
interface for its socket transport).

Every problem is one :class:`~collsim.errors.TopologyError` naming the file, the element and the
value: malformed XML, a missing attribute, an unknown PCIe speed, a GPU slot without a ``<gpu>``
(an ``NCCL_TOPO_FILE`` overlay, which holds only placement hints, rather than a dump).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

from collsim.errors import TopologyError
from collsim.topology.imports.inventory import PCIE_GTS, Cpu, Gpu, Inventory, Nic, read_input

NVSWITCH_CLASS = "0x068000"
CPU_CLASS = "0x068001"
_RDMA = re.compile(r"^(mlx[45]_|bnxt_re|irdma|rdma|ionic|erdma|hns_|qedr|rxe)")
_VIRTUAL = re.compile(r"^(docker|veth|br-|virbr|lo$|cni|flannel|cali|tunl|vxlan)")


class _Reader:
    """One pass over the tree, collecting GPUs (with their NVLinks) and NICs."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.gpus: list[tuple[int, Gpu, ET.Element]] = []
        self.nics: list[Nic] = []
        self.notes: list[str] = []

    def error(self, element: ET.Element, attr: str, message: str, value: object) -> TopologyError:
        return TopologyError(message, file=self.file, field=f"{_tag(element)}.{attr}", value=value)

    def attr(self, element: ET.Element, name: str) -> str:
        value = element.get(name)
        if value is None:
            raise TopologyError(
                f"<{element.tag}> has no '{name}' attribute (a partial or hand-edited dump?)",
                file=self.file, field=_tag(element), value=None, has_value=False,
            )  # fmt: skip
        return value

    def integer(self, element: ET.Element, name: str, default: int | None = None) -> int:
        text = element.get(name)
        if text is None and default is not None:
            return default
        text = self.attr(element, name)
        try:
            return int(text, 0)
        except ValueError:
            raise self.error(element, name, "not an integer", text) from None

    def speed(self, element: ET.Element) -> tuple[float | None, int]:
        """A PCI element's link speed (GT/s; ``None`` where sysfs reported none) and width."""
        text = element.get("link_speed", "")
        width = self.integer(element, "link_width", 0)
        if text.strip() in ("", "Unknown", "Unknown speed"):
            return None, width
        if text not in PCIE_GTS:
            known = ", ".join(sorted({k for k in PCIE_GTS if k.endswith("PCIe")}))
            raise self.error(element, "link_speed", f"unknown PCIe speed (known: {known})", text)
        return PCIE_GTS[text], width

    def walk(self, element: ET.Element, numa: int, bridges: tuple[str, ...]) -> None:
        for child in element:
            if child.tag == "pci":
                self.pci(child, numa, bridges)
            elif child.tag == "nic":
                self.nic(child, numa, None, (None, 16), bridges, "")

    def pci(self, element: ET.Element, numa: int, bridges: tuple[str, ...]) -> None:
        busid = self.attr(element, "busid").lower()
        klass = element.get("class", "").lower()
        link = self.speed(element)
        gpu = element.find("gpu")
        nic = element.find("nic")
        if gpu is not None:
            self.gpu(gpu, busid, numa, element, link, bridges)
        elif nic is not None:
            self.nic(nic, numa, busid, link, bridges, klass)
        elif klass.startswith("0x03"):
            raise TopologyError(
                "a GPU slot without a <gpu> element: this is an NCCL_TOPO_FILE overlay (placement "
                "hints only), not a dump; import the file NCCL writes with "
                "NCCL_TOPO_DUMP_FILE=topo.xml",
                file=self.file, field=_tag(element), value=klass,
            )  # fmt: skip
        elif klass == NVSWITCH_CLASS:
            return
        elif klass.startswith("0x02"):
            self.notes.append(f"network device {busid} without a <nic> (no driver?) left out")
        else:
            self.walk(element, numa, (busid, *bridges))

    def gpu(
        self,
        element: ET.Element,
        busid: str,
        numa: int,
        pci: ET.Element,
        link: tuple[float | None, int],
        bridges: tuple[str, ...],
    ) -> None:
        rank = self.integer(element, "rank", -2)
        dev = self.integer(element, "dev")
        order = rank if rank >= 0 else dev
        sm = self.integer(element, "sm")
        gpu = Gpu(busid, numa, sm, pci.get("device"), link[0], link[1], bridges)
        self.gpus.append((order, gpu, element))

    def nic(
        self,
        element: ET.Element,
        numa: int,
        busid: str | None,
        link: tuple[float | None, int],
        bridges: tuple[str, ...],
        klass: str,
    ) -> None:
        nets = element.findall("net")
        if not nets:
            raise TopologyError("<nic> without any <net> port", file=self.file,
                                field=_tag(element), value=busid)  # fmt: skip
        for net in nets:
            name = self.attr(net, "name")
            speed = self.integer(net, "speed")
            if speed <= 0:
                raise self.error(net, "speed", "a port speed must be positive (Mb/s)", speed)
            if _VIRTUAL.match(name):
                self.notes.append(f"virtual interface {name} left out")
                continue
            if name.startswith("efa"):
                kind = "efa"
            elif _RDMA.match(name):
                kind = "infiniband" if klass.startswith("0x0207") else "roce"
            else:
                kind = "ethernet"
            self.nics.append(Nic(name, numa, kind, speed / 1000, busid, link[0], link[1], bridges))


def _tag(element: ET.Element) -> str:
    """``<pci busid='0000:0f:00.0'>``: the element as a user finds it in the file."""
    keys = ("busid", "name", "dev", "numaid", "target")
    shown = " ".join(f"{k}='{element.get(k)}'" for k in keys if element.get(k) is not None)
    return f"<{element.tag}{' ' + shown if shown else ''}>"


def read_nccl_xml(path: str | Path) -> Inventory:
    """The server described by an NCCL topology dump (see the module doc)."""
    file = str(path)
    try:
        root = ET.fromstring(read_input(path))
    except ET.ParseError as exc:
        line, column = exc.position
        raise TopologyError(f"malformed XML at line {line}, column {column + 1}",
                            file=file, value=str(exc).split(":")[0]) from None  # fmt: skip
    if root.tag != "system":
        raise TopologyError("not an NCCL topology: the root element must be <system>",
                            file=file, field="root", value=root.tag)  # fmt: skip
    reader = _Reader(file)
    for child in root:
        if child.tag in ("pci", "nic", "gpu"):
            raise TopologyError(
                f"<{child.tag}> outside any <cpu>: no NUMA node, so no GPU affinity can be read",
                file=file, field=_tag(child), value=child.get("busid") or child.get("name"),
            )  # fmt: skip
    cpus = []
    for cpu in root.findall("cpu"):
        numa = reader.integer(cpu, "numaid")
        family = cpu.get("familyid")
        model = cpu.get("modelid")
        cpus.append(Cpu(numa, cpu.get("vendor", ""), _int(family), _int(model)))
        reader.walk(cpu, numa, ())
    if not reader.gpus:
        raise TopologyError("no <gpu> element anywhere: nothing to import (a partial dump?)",
                            file=file, field="<system>", value=None)  # fmt: skip
    reader.gpus.sort(key=lambda item: item[0])
    gpus = [gpu for _, gpu, _ in reader.gpus]
    inv = Inventory([file], gpus, reader.nics, cpus, notes=reader.notes)
    _nvlinks(inv, reader, [element for _, _, element in reader.gpus])
    return inv


def _int(text: str | None) -> int | None:
    try:
        return int(text, 0) if text is not None else None
    except ValueError:
        return None


def _nvlinks(inv: Inventory, reader: _Reader, elements: list[ET.Element]) -> None:
    """NVLinks into NVSwitches per GPU, and direct GPU-GPU links (counted from the lower GPU)."""
    index = {gpu.busid: i for i, gpu in enumerate(inv.gpus)}
    switch = [0] * len(inv.gpus)
    for i, element in enumerate(elements):
        for link in element.findall("nvlink"):
            count = reader.integer(link, "count")
            target = reader.attr(link, "target").lower()
            tclass = link.get("tclass", "").lower()
            if count <= 0:
                raise reader.error(link, "count", "an NVLink count must be positive", count)
            if tclass == NVSWITCH_CLASS:
                switch[i] += count
            elif tclass == CPU_CLASS:
                inv.notes.append(f"GPU {i}: {count} NVLinks to the CPU left out")
            elif target == inv.gpus[i].busid:
                inv.notes.append(f"GPU {i}: an NVLink entry to itself (count {count}) left out")
            elif target in index:
                a, b = sorted((i, index[target]))
                if (a, b) in inv.nvlink_pairs and inv.nvlink_pairs[(a, b)] != count:
                    inv.notes.append(f"GPUs {a}-{b}: NVLink counts differ by side; the lower kept")
                    count = min(count, inv.nvlink_pairs[(a, b)])
                inv.nvlink_pairs[(a, b)] = count
            else:
                raise reader.error(link, "target", "an NVLink to a device not in the file", target)
    inv.nvswitch_links = switch if any(switch) else []
