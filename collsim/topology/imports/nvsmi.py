"""Read ``nvidia-smi topo -m``: how each GPU reaches every other GPU and NIC.

The matrix labels each pair: ``NV#`` (a bonded set of # NVLinks), ``PIX`` (one PCIe switch),
``PXB`` (several switches), ``PHB`` (the CPU's host bridge), ``NODE`` (host bridges within a
NUMA node), ``SYS`` (across sockets; ``SOC`` in old drivers). Newer drivers name NIC columns
``NIC0..`` with a ``NIC Legend`` mapping them to devices (``NIC0: mlx5_0``); older ones print the
device names as column heads. Trailing columns give CPU and NUMA affinity.

Merged into an NCCL dump (:func:`merge`) the matrix decides GPU-NIC affinity and supplies NVLinks
the dump lacks; alone (:func:`inventory_from_nvsmi`) it describes a server whose GPU model and
NIC rate the caller names, since the matrix holds neither.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from collsim.errors import TopologyError
from collsim.topology.imports.inventory import Gpu, Inventory, Nic, read_input

_CELL = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC)$")
_SWITCH_LINKS = {70: 6, 80: 12, 86: 4, 90: 18, 100: 18}
"""The most NVLinks one GPU has (V100 6, A100 12, GA102 4, H100 18, B200 18): a pair showing
``NV12`` between all of 8 A100s (7 x 12 links) must go through NVSwitches."""


@dataclass
class Matrix:
    """The parsed matrix: ``gpus`` and ``nics`` column names, ``cell[(row, col)]``, GPU NUMA."""

    file: str
    gpus: list[str]
    nics: list[str]
    cell: dict[tuple[str, str], str]
    numa: dict[str, int]


def read_nvsmi(path: str | Path) -> Matrix:
    """Parse the output of ``nvidia-smi topo -m`` (see the module doc)."""
    file = str(path)
    lines = read_input(path).decode("utf-8", errors="replace").splitlines()
    head = next((i for i, line in enumerate(lines) if line.split()[:1] == ["GPU0"]
                 or (line.startswith((" ", "\t")) and "GPU0" in line.split())), None)  # fmt: skip
    if head is None:
        raise TopologyError("no 'GPU0' column heading: not nvidia-smi topo -m output",
                            file=file, field="heading", value=None)  # fmt: skip
    cols = []
    for token in lines[head].split():
        if token in ("CPU", "NUMA", "GPU") and cols:
            break
        cols.append(token)
    legend = dict(re.findall(r"^\s*(NIC\d+):\s*(\S+)", "\n".join(lines), re.M))
    cell: dict[tuple[str, str], str] = {}
    affinity: dict[str, list[str]] = {}
    for number, line in enumerate(lines[head + 1 :], start=head + 2):
        tokens = line.split()
        if not tokens or tokens[0] not in cols:
            continue
        row, values = tokens[0], tokens[1 : 1 + len(cols)]
        for col, value in zip(cols, values, strict=False):
            if not _CELL.match(value):
                raise TopologyError(f"unknown entry in row {row}, column {col}", file=file,
                                    field=f"line {number}", value=value)  # fmt: skip
            cell[(row, col)] = "SYS" if value == "SOC" else value
        rest = tokens[1 + len(cols) :]
        if row.startswith("GPU"):
            affinity[row] = rest
    # The NUMA column where there is one, else sockets numbered by distinct CPU affinity.
    cpusets = list(dict.fromkeys(rest[0] if rest else "" for rest in affinity.values()))
    numa = {
        row: int(rest[1]) if len(rest) > 1 and rest[1].isdigit()
        else cpusets.index(rest[0] if rest else "")
        for row, rest in affinity.items()
    }  # fmt: skip
    gpus = [c for c in cols if re.match(r"^GPU\d+$", c)]
    nics = [legend.get(c, c) for c in cols if c not in gpus]
    renamed = {c: legend.get(c, c) for c in cols}
    cell = {(renamed[r], renamed[c]): v for (r, c), v in cell.items()}
    missing = [g for g in gpus if (g, gpus[0]) not in cell]
    if missing:
        raise TopologyError("GPU without a row", file=file, field="matrix", value=missing[0])
    return Matrix(file, gpus, nics, cell, numa)


def _links(m: Matrix, sm: int) -> tuple[list[int], dict[tuple[int, int], int]]:
    """NVSwitch links per GPU, or direct GPU-GPU pairs, from the ``NV#`` entries."""
    pairs = {}
    for a in range(len(m.gpus)):
        for b in range(a + 1, len(m.gpus)):
            value = m.cell.get((m.gpus[a], m.gpus[b]), "SYS")
            if value.startswith("NV"):
                pairs[(a, b)] = int(value[2:])
    counts = set(pairs.values())
    g = len(m.gpus)
    full = len(pairs) == g * (g - 1) // 2
    if full and len(counts) == 1 and g > 2:
        k = counts.pop()
        if (g - 1) * k > _SWITCH_LINKS.get(sm, 18):
            return [k] * g, {}
    return [], pairs


def merge(inv: Inventory, m: Matrix) -> None:
    """Put the matrix's GPU-NIC affinity (and NVLinks, where the dump has none) into ``inv``."""
    if len(m.gpus) != len(inv.gpus):
        raise TopologyError(
            f"{len(m.gpus)} GPUs, but the NCCL dump has {len(inv.gpus)}: not the same server?",
            file=m.file, field="GPU columns", value=len(m.gpus),
        )  # fmt: skip
    inv.sources.append(m.file)
    if not inv.nvswitch_links and not inv.nvlink_pairs:
        inv.nvswitch_links, inv.nvlink_pairs = _links(m, inv.gpus[0].sm or 80)
    names = {nic.name: j for j, nic in enumerate(inv.nics)}
    for nic in m.nics:
        if nic not in names:
            inv.notes.append(f"{nic} of the nvidia-smi matrix is not among the dump's NICs")
            continue
        for i, gpu in enumerate(m.gpus):
            value = m.cell.get((gpu, nic))
            if value is None or value.startswith("NV") or value == "X":
                raise TopologyError("a NIC with no GPU affinity", file=m.file,
                                    field=f"row {gpu}, column {nic}", value=value)  # fmt: skip
            inv.affinity[(i, names[nic])] = value.lower()


def inventory_from_nvsmi(
    m: Matrix, *, sm: int, nic_speed_gbps: float | None, nic_kind: str
) -> Inventory:
    """A server from the matrix alone: GPUs of compute capability ``sm``; NICs (if any) all of
    ``nic_speed_gbps`` and ``nic_kind``, which the matrix does not say."""
    if m.nics and nic_speed_gbps is None:
        raise TopologyError("the matrix lists NICs but not their rate: give --nic-speed "
                            "(e.g. 400Gbps) or the NCCL dump", file=m.file, field="NIC columns",
                            value=", ".join(m.nics))  # fmt: skip
    gpus = [Gpu(f"matrix:{g}", m.numa.get(g, 0), sm) for g in m.gpus]
    nics = []
    for nic in m.nics:
        near = [i for i, g in enumerate(m.gpus) if m.cell.get((g, nic)) in ("PIX", "PXB")]
        numa = gpus[near[0]].numa if near else 0
        nics.append(Nic(nic, numa, nic_kind, nic_speed_gbps))
    inv = Inventory([m.file], gpus, nics)
    inv.nvswitch_links, inv.nvlink_pairs = _links(m, sm)
    for j, nic in enumerate(m.nics):
        for i, g in enumerate(m.gpus):
            value = m.cell.get((g, nic), "SYS")
            if value not in ("PIX", "PXB", "PHB", "NODE", "SYS"):
                raise TopologyError("a NIC with no GPU affinity", file=m.file,
                                    field=f"row {g}, column {nic}", value=value)  # fmt: skip
            inv.affinity[(i, j)] = value.lower()
    return inv
