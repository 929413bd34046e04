"""One server as a machine reports it: GPUs, NVLinks, NICs and where each sits in the PCIe tree.

The readers (:mod:`.ncclxml`, :mod:`.nvsmi`) fill an :class:`Inventory`; :mod:`.build` turns it
into a topology file. Nothing here knows a file format.

Facts used to turn what a machine reports into rates (per direction, as the topology format wants):

* PCIe: ``GT/s x lanes x encoding / 8`` bytes/s, encoding 8b/10b up to 5 GT/s (Gen1-2) and
  128b/130b from 8 GT/s (Gen3-5), 242/256 for Gen6's FLIT mode (PCI-SIG base specifications).
  A link width of 0 (a VM's virtual function) counts as 16 lanes, as NCCL does (``src/graph/
  topo.cc``, ``ncclTopoAddPci``: "if (width == 0) width = 16").
* NVLink per link and direction, by the GPU's compute capability (``sm``): 20 GB/s NVLink 1
  (P100), 25 GB/s NVLink 2-4 (V100, A100, H100), 14.0625 GB/s for the GA102 bridge (RTX 3090 /
  A6000: 112.5 GB/s both ways over 4 links), 50 GB/s NVLink 5 (B200, B300); NVIDIA's P100, V100,
  A100, H100 and Blackwell architecture white papers and the RTX A6000 datasheet.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from collsim.errors import TopologyError

PATH_CLASSES = ("pix", "pxb", "phb", "node", "sys")
"""GPU-to-NIC PCIe paths, nearest first, as ``nvidia-smi topo -m`` labels them (and the topology
format's ``nics.gpu_path``)."""

PCIE_GTS = {
    "2.5 GT/s": 2.5, "5 GT/s": 5.0, "8 GT/s": 8.0, "16 GT/s": 16.0, "32 GT/s": 32.0,
    "2.5 GT/s PCIe": 2.5, "5.0 GT/s PCIe": 5.0, "8.0 GT/s PCIe": 8.0, "16.0 GT/s PCIe": 16.0,
    "32.0 GT/s PCIe": 32.0, "64.0 GT/s PCIe": 64.0,
}  # fmt: skip
"""The ``link_speed`` strings Linux writes in sysfs (and NCCL copies into its dump), as NCCL's
``kvDictPciGen`` lists them (the forms of kernels up to 5.6 and after)."""


def read_input(path: str | Path, limit: int | None = None) -> bytes:
    """An input file's bytes (the first ``limit`` of them), or one error naming the file."""
    try:
        with open(path, "rb") as f:
            return f.read(limit) if limit is not None else f.read()
    except OSError as exc:
        raise TopologyError(f"cannot read: {exc.strerror}", file=str(path)) from None


def pcie_bytes_per_s(gts: float, width: int) -> float:
    """One direction of a PCIe link of ``width`` lanes at ``gts`` GT/s (0 lanes read as 16)."""
    lanes = width if width > 0 else 16
    encoding = 0.8 if gts <= 5.0 else (242 / 256 if gts >= 64.0 else 128 / 130)
    return gts * 1e9 * lanes * encoding / 8


def nvlink_bytes_per_s(sm: int) -> float:
    """One NVLink link, one direction, for a GPU of compute capability ``sm`` (see module doc)."""
    if sm >= 100:
        return 50e9
    if sm == 86:
        return 14.0625e9
    if sm >= 70:
        return 25e9
    return 20e9


@dataclass(frozen=True)
class Cpu:
    """A CPU socket (NUMA node) as the dump describes it."""

    numa: int
    vendor: str = ""
    family: int | None = None
    model: int | None = None


@dataclass(frozen=True)
class Gpu:
    """One GPU: its place in the PCIe tree (``bridges``: the switches above it, nearest first)."""

    busid: str
    numa: int
    sm: int | None = None
    device_id: str | None = None
    pcie_gts: float | None = None
    pcie_width: int = 16
    bridges: tuple[str, ...] = ()


@dataclass(frozen=True)
class Nic:
    """One network port: ``kind`` a topology link kind (``infiniband``, ``roce``, ``ethernet``)."""

    name: str
    numa: int
    kind: str
    speed_gbps: float | None = None
    busid: str | None = None
    pcie_gts: float | None = None
    pcie_width: int = 16
    bridges: tuple[str, ...] = ()


@dataclass
class Inventory:
    """One server. GPUs in local-rank order; ``nvswitch_links[i]``: GPU ``i``'s NVLinks into
    NVSwitches (empty when there are none); ``nvlink_pairs``: direct GPU-GPU links ``(i, j) ->
    count`` with ``i < j``; ``affinity[(i, j)]``: the PCIe path class from GPU ``i`` to NIC ``j``
    (:data:`PATH_CLASSES`), filled from the PCIe tree unless a reader knows it directly;
    ``notes``: what was left out or assumed, for the imported file's ``source``."""

    sources: list[str]
    gpus: list[Gpu]
    nics: list[Nic] = field(default_factory=list)
    cpus: list[Cpu] = field(default_factory=list)
    nvswitch_links: list[int] = field(default_factory=list)
    nvlink_pairs: dict[tuple[int, int], int] = field(default_factory=dict)
    affinity: dict[tuple[int, int], str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def path(self, gpu: int, nic: int) -> str:
        """The PCIe path class from GPU ``gpu`` to NIC ``nic``."""
        if (gpu, nic) in self.affinity:
            return self.affinity[(gpu, nic)]
        return tree_path(self.gpus[gpu], self.nics[nic])

    def nearest_nics(self, gpu: int) -> list[int]:
        """The NICs nearest GPU ``gpu`` (all at its best path class), in NIC order."""
        if not self.nics:
            return []
        ranks = [PATH_CLASSES.index(self.path(gpu, j)) for j in range(len(self.nics))]
        best = min(ranks)
        return [j for j, r in enumerate(ranks) if r == best]


def tree_path(gpu: Gpu, nic: Nic) -> str:
    """The path class between a GPU and a NIC from their places in the PCIe tree: one switch
    above both (``pix``), a switch shared higher up (``pxb``), only the CPU (``phb``), or
    another socket (``sys``)."""
    if gpu.numa != nic.numa:
        return "sys"
    if gpu.bridges and nic.bridges and gpu.bridges[0] == nic.bridges[0]:
        return "pix"
    if set(gpu.bridges) & set(nic.bridges):
        return "pxb"
    return "phb"
