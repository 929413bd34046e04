"""``collsim topo import``: recognise each input file, read it, and write the topology document.

Inputs, in any order: one NCCL topology dump (the server), at most one ``nvidia-smi topo -m``
output (GPU-NIC affinity, NVLinks; alone it can describe the server too) and at most one
``ibnetdiscover`` output (the fabric). Each is recognised by its content, not its name.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from collsim.errors import TopologyError
from collsim.topology.imports.build import build_document
from collsim.topology.imports.gpus import gpu_section
from collsim.topology.imports.ibnet import fabric_section, read_ibnetdiscover
from collsim.topology.imports.inventory import Inventory, read_input
from collsim.topology.imports.ncclxml import read_nccl_xml
from collsim.topology.imports.nvsmi import inventory_from_nvsmi, merge, read_nvsmi
from collsim.topology.loader import topology_from_dict

KINDS = ("nccl-xml", "nvidia-smi", "ibnetdiscover")


def sniff(path: str | Path) -> str:
    """Which of :data:`KINDS` a file holds, from its first few kilobytes."""
    head = read_input(path, 8192).decode("utf-8", errors="replace")
    if head.lstrip().startswith("<"):
        return "nccl-xml"
    if '"S-' in head and ("Switch" in head or "switchguid" in head):
        return "ibnetdiscover"
    if "GPU0" in head:
        return "nvidia-smi"
    raise TopologyError(
        "not an NCCL topology dump (XML), nvidia-smi topo -m output or ibnetdiscover output",
        file=str(path), field="content", value=head.strip()[:40],
    )  # fmt: skip


@dataclass
class ImportRequest:
    """What the user asked for besides the files (the CLI's options)."""

    name: str
    nodes: int | None = None
    gpu: str | None = None
    p2p: bool | None = None
    nic_speed_gbps: float | None = None
    nic_kind: str = "infiniband"


_SM_BY_NAME = (("B300", 103), ("B200", 100), ("GB200", 100), ("H100", 90), ("H200", 90),
               ("H800", 90), ("A100", 80), ("A800", 80), ("A6000", 86), ("RTX 30", 86),
               ("V100", 70), ("P100", 60))  # fmt: skip
"""Compute capability by model name, for a matrix-only import (the matrix has no ``sm``)."""


def import_files(paths: list[str], request: ImportRequest) -> dict[str, Any]:
    """The topology document the files describe (validated: it loads)."""
    found: dict[str, list[str]] = {kind: [] for kind in KINDS}
    for path in paths:
        found[sniff(path)].append(path)
    for kind, files in found.items():
        if len(files) > 1:
            raise TopologyError(f"one {kind} file per import (one server, one fabric)",
                                file=files[1], field="FILE", value=kind)  # fmt: skip
    gpu = gpu_section(request.gpu) if request.gpu else None
    inv = _inventory(found, request, gpu)
    fabric, words, hosts = None, "", None
    if found["ibnetdiscover"]:
        scan = read_ibnetdiscover(found["ibnetdiscover"][0])
        fabric, words = fabric_section(scan)
        hosts = len(scan.host_names())
        inv.sources.append(scan.file)
        inv.notes.append(words)
    nodes = request.nodes or hosts or 1
    try:
        doc = build_document(inv, name=request.name, nodes=nodes, gpu=gpu, p2p=request.p2p,
                             fabric=fabric)  # fmt: skip
        topology_from_dict(doc, nodes=None, file=request.name)
    except TopologyError as exc:
        if fabric is not None and (exc.field or "").startswith("fabric"):
            # the scanned fabric cannot hold these servers: say so where the fabric came from
            exc.message += f" ({nodes} servers of {len(inv.nics)} NICs on the scanned fabric)"
            raise exc.located(file=found["ibnetdiscover"][0]) from None
        raise exc.located(file=(found["nccl-xml"] or found["nvidia-smi"])[0]) from None
    return doc


def _inventory(
    found: dict[str, list[str]], request: ImportRequest, gpu: dict[str, Any] | None
) -> Inventory:
    if found["nccl-xml"]:
        inv = read_nccl_xml(found["nccl-xml"][0])
        if found["nvidia-smi"]:
            merge(inv, read_nvsmi(found["nvidia-smi"][0]))
        return inv
    if not found["nvidia-smi"]:
        raise TopologyError("no server described: give an NCCL topology dump or nvidia-smi "
                            "topo -m output", field="FILE", value=None)  # fmt: skip
    matrix = read_nvsmi(found["nvidia-smi"][0])
    if gpu is None:
        raise TopologyError("the nvidia-smi matrix does not name the GPU: give --gpu (a catalog "
                            "entry, e.g. dgx-h100) or the NCCL dump", file=matrix.file,
                            field="--gpu", value=None)  # fmt: skip
    model = str(gpu.get("model", ""))
    sm = next((s for key, s in _SM_BY_NAME if key in model), 80)
    return inventory_from_nvsmi(matrix, sm=sm, nic_speed_gbps=request.nic_speed_gbps,
                                nic_kind=request.nic_kind)  # fmt: skip


def to_yaml(doc: dict[str, Any]) -> str:
    """The document as a topology file, with a header saying where it came from."""
    header = (
        "# Written by `collsim topo import`; its `source:` says from what and what was assumed.\n"
        "# Check it with `collsim topo show FILE`; compare it with `collsim topo diff FILE "
        "CATALOG_ENTRY`.\n"
    )
    return header + yaml.safe_dump(doc, sort_keys=False, width=100)
