"""Which GPU a PCI device id is, and the ``gpu:`` section an imported topology gives it.

NCCL's dump names a GPU only by its PCI ids (``vendor="0x10de" device="0x2330"``) and compute
capability. Device ids are from the PCI ID Repository (pci-ids.ucw.cz, vendor 10de). Where the
catalog has the GPU, its section (datasheet figures, measured matmul rates, sources) is copied
from that catalog entry, its *twin*, so an import and the catalog entry agree on compute; the
twin is also what ``collsim topo diff`` compares an import with by default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from collsim.errors import TopologyError
from collsim.topology.loader import read_yaml, resolve


@dataclass(frozen=True)
class KnownGpu:
    """A GPU by PCI device id: its name, the catalog entry holding its ``gpu:`` section (or the
    section itself), and whether its driver offers peer-to-peer over PCIe (GeForce cards do not,
    as the catalog's RTX entries say)."""

    model: str
    twin: str | None
    p2p: bool = True
    section: dict[str, Any] | None = None


_A6000 = {
    "model": "RTX A6000 48GB",
    "peak_tflops": {"bf16": 154.8, "fp16": 154.8, "tf32": 77.4, "fp32": 38.7},
    "memory": "48GiB",
    "memory_bandwidth": "768GB/s",
    "source": "NVIDIA RTX A6000 datasheet: 309.7 TFLOPS tensor with sparsity (154.8 dense), "
    "38.7 TFLOPS FP32, 48 GB GDDR6 at 768 GB/s",
}
_L20 = {
    "model": "L20 48GB",
    "peak_tflops": {"fp8": 239, "bf16": 119.5, "fp16": 119.5, "tf32": 59.8, "fp32": 59.8},
    "memory": "48GiB",
    "memory_bandwidth": "864GB/s",
    "source": "NVIDIA L20 datasheet: FP8 478, FP16/BF16 239, TF32 119.5 TFLOPS with sparsity "
    "(dense: half), FP32 59.8 TFLOPS, 48 GB GDDR6 at 864 GB/s",
}
_H800 = {
    "model": "H800 SXM5 80GB",
    "peak_tflops": {"fp8": 1978.9, "bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},
    "memory": "80GiB",
    "memory_bandwidth": "3.35TB/s",
    "matmul_tflops": {"fp8": 1402.6, "bf16": 794.5, "fp16": 794.5},
    "sms": 132,
    "source": "NVIDIA H800 SXM5: the H100 SXM5's tensor rates and 80 GB HBM3 at 3.35 TB/s, with "
    "NVLink cut to 400 GB/s both ways (8 links; H800 datasheet). Best matmul: the H100 SXM's "
    "measurement (same GH100 die and clocks; catalog dgx-h100, from Bekman's Machine Learning "
    "Engineering Open Book table)",
}

KNOWN_GPUS: dict[str, KnownGpu] = {
    "0x1db1": KnownGpu("Tesla V100 SXM2 16GB", "dgx1-v100"),
    "0x1db5": KnownGpu("Tesla V100 SXM2 32GB", "dgx1-v100"),
    "0x1db8": KnownGpu("Tesla V100 SXM3 32GB", "dgx2-v100"),
    "0x1eb8": KnownGpu("Tesla T4 16GB", "g4dn-efa"),
    "0x1e07": KnownGpu("GeForce RTX 2080 Ti 11GB", "rtx2080ti-2gpu-nop2p", p2p=False),
    "0x20b0": KnownGpu("A100 SXM4 40GB", "dgx-a100"),
    "0x20b2": KnownGpu("A100 SXM4 80GB", "selene"),
    "0x20f1": KnownGpu("A100 PCIe 40GB", "a100-pcie-2gpu"),
    "0x20b5": KnownGpu("A100 PCIe 80GB", "roce-100g"),
    "0x2204": KnownGpu("GeForce RTX 3090 24GB", "rtx3090-8gpu-pcie", p2p=False),
    "0x2230": KnownGpu("RTX A6000 48GB", None, section=_A6000),
    "0x2684": KnownGpu("GeForce RTX 4090 24GB", "rtx4090-4gpu-pcie", p2p=False),
    "0x26ba": KnownGpu("L20 48GB", None, section=_L20),
    "0x2330": KnownGpu("H100 SXM5 80GB", "dgx-h100"),
    "0x2331": KnownGpu("H100 PCIe 80GB", "roce-400g"),
    "0x2324": KnownGpu("H800 SXM5 80GB", "dgx-h100", section=_H800),
    "0x2901": KnownGpu("B200 SXM 180GB", "hgx-b200"),
}


def gpu_section(name_or_path: str) -> dict[str, Any]:
    """The ``gpu:`` section of a catalog entry or topology file (``--gpu`` of ``topo import``)."""
    path = resolve(name_or_path)
    data = read_yaml(path)
    if not isinstance(data, dict) or not isinstance(data.get("gpu"), dict):
        raise TopologyError("has no 'gpu:' section to take", file=str(path), field="gpu")
    return dict(data["gpu"])


def identify(device_id: str | None, busid: str, file: str) -> KnownGpu:
    """The known GPU with this PCI device id, or an error saying how to name it."""
    known = KNOWN_GPUS.get((device_id or "").lower())
    if known is None:
        raise TopologyError(
            "unknown GPU (PCI device id not in collsim's table): name its gpu: section with "
            "--gpu CATALOG_ENTRY_OR_FILE",
            file=file, field=f"<pci busid='{busid}'>.device", value=device_id,
        )  # fmt: skip
    return known


def known_section(known: KnownGpu) -> dict[str, Any]:
    """The ``gpu:`` section for a known GPU: its own, or its catalog twin's."""
    if known.section is not None:
        return dict(known.section)
    return gpu_section(known.twin or "")
